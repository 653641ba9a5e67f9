/* The recorder's hot path in C: what a timed scope costs the training thread.
 *
 * Optional: without it (no compiler at install time, or RESETTRACE_PURE_PYTHON=1) the
 * pure-Python implementation in recorder.py records the same records. Each function here
 * takes the common case of its kind and hands every other case, before it has changed
 * anything, to the Python implementation that setup_recorder() / setup_api() gave it:
 *
 * - RecorderBase: the base of recorder.Recorder, holding the state the hot path reads
 *   (stack, records, laps, scopes, named scopes, owner thread, traces closed); its
 *   scope() arms a scope inside this thread's open trace.
 * - Records: a recorder's open trace, RECORD_FIELDS int64s per record (layout.py's
 *   fields) in one block the recorder keeps across traces; Trace: a finished one.
 * - ScopeBase: the base of recorder.Scope. __enter__ / __exit__ / lap of a scope (a
 *   record [index, parent, start, end, count, error] written into the recorder's Records,
 *   its position pushed on its stack; closed in place; a trace that closes copied into
 *   one Trace). An exit that is not on top, a count that is not a plain int, an
 *   overflow: Python.
 * - Traced: the core of a traced() wrapper (api.py): a call, an extension's call inside
 *   a phase (a leaf), or a call that is several levels of the catalog at once (a chain).
 *
 * Positions are Python ints in Python lists (the stack, the laps) and records are int64s
 * in the Records, as the Python code keeps them: both implementations share the
 * recorder's state and may interleave.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <structmember.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

/* Code off the common path: kept apart from it, so that a cold call (the caches emptied
 * by a physics step) reads fewer lines of code. */
#if defined(__GNUC__)
#define COLD __attribute__((cold, noinline))
#else
#define COLD
#endif

#include "_layout.h"  /* R_PHASE ... R_ERROR, RECORD_FIELDS: layout.py's */

static PyObject *str_index,
    *str_name, *str_on_trace, *str_trace_queue, *str_catalog;
static PyObject *zero;            /* the int 0 */
static PyObject *no_count;        /* the int -1: no count given */
static PyObject *clock_fn;        /* a replacement clock (tests), or NULL */
static PyObject *error_code_fn;   /* recorder.error_code: exception type name -> code */
/* recorder.MAX_TRACE_RECORDS (set by setup() and set_max_records()): a trace that holds
 * as many takes the Python path, which closes it (0 until set: every scope takes it) */
static Py_ssize_t max_recs = 0;

static inline Py_ssize_t
max_records(void)
{
    return max_recs;
}

/* The recorder's clock: time.perf_counter_ns (CLOCK_MONOTONIC on Linux). */
static int
now_ns(long long *out)
{
    if (clock_fn != NULL) {
        PyObject *t = PyObject_CallNoArgs(clock_fn);
        if (t == NULL) {
            return -1;
        }
        *out = PyLong_AsLongLong(t);
        Py_DECREF(t);
        return (*out == -1 && PyErr_Occurred()) ? -1 : 0;
    }
#if defined(CLOCK_MONOTONIC) && defined(__linux__)
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    *out = (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
    return 0;
#else
#error "resettrace._fast needs CLOCK_MONOTONIC (Linux); the pure-Python recorder runs elsewhere"
#endif
}

/* The clock read after the traced call: its exception, if any, stays pending (a clock of
 * Python code must not run with it set). */
static void
now_after(long long *t)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (now_ns(t) < 0) {
        PyErr_WriteUnraisable(clock_fn);
        *t = 0;
    }
    PyErr_Restore(type, value, tb);
}

/* ---------------------------------------------------------------- Trace */
/* A finished trace, as the sinks get it: its records' fields (layout.py's order) in one
 * block of int64, no Python object per record. A sequence of records, each read as a
 * tuple of RECORD_FIELDS ints; its buffer (and .data) the flat int64s, for numpy. */
typedef struct {
    PyObject_VAR_HEAD    /* ob_size: the int64s held (RECORD_FIELDS per record) */
    int64_t v[1];
} Trace;

static PyTypeObject TraceType;

static Py_ssize_t
trace_len(Trace *self)
{
    return Py_SIZE(self) / RECORD_FIELDS;
}

static PyObject *
trace_row(Trace *self, Py_ssize_t i)
{
    if (i < 0 || i >= trace_len(self)) {
        PyErr_SetString(PyExc_IndexError, "trace index out of range");
        return NULL;
    }
    PyObject *row = PyTuple_New(RECORD_FIELDS);
    if (row == NULL) {
        return NULL;
    }
    for (int f = 0; f < RECORD_FIELDS; f++) {
        PyObject *x = PyLong_FromLongLong(self->v[i * RECORD_FIELDS + f]);
        if (x == NULL) {
            Py_DECREF(row);
            return NULL;
        }
        PyTuple_SET_ITEM(row, f, x);
    }
    return row;
}

static PyObject *
trace_subscript(Trace *self, PyObject *key)
{
    Py_ssize_t n = trace_len(self);
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred()) {
            return NULL;
        }
        return trace_row(self, i < 0 ? i + n : i);
    }
    if (PySlice_Check(key)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(key, &start, &stop, &step) < 0) {
            return NULL;
        }
        Py_ssize_t m = PySlice_AdjustIndices(n, &start, &stop, step);
        PyObject *out = PyList_New(m);
        for (Py_ssize_t k = 0; out != NULL && k < m; k++) {
            PyObject *row = trace_row(self, start + k * step);
            if (row == NULL) {
                Py_CLEAR(out);
                break;
            }
            PyList_SET_ITEM(out, k, row);
        }
        return out;
    }
    return PyErr_Format(PyExc_TypeError, "trace indices must be integers or slices, not %s",
                        Py_TYPE(key)->tp_name);
}

static PyObject *
trace_item(Trace *self, Py_ssize_t i)
{
    return trace_row(self, i);
}

static Py_ssize_t int64_stride = 8;

static int
trace_getbuffer(Trace *self, Py_buffer *view, int flags)
{
    /* read-only (a writable request fails here), then int64 items */
    if (PyBuffer_FillInfo(view, (PyObject *)self, self->v, Py_SIZE(self) * 8, 1, flags) < 0) {
        return -1;
    }
    view->itemsize = 8;
    view->format = (flags & PyBUF_FORMAT) ? "q" : NULL;
    view->shape = (flags & PyBUF_ND) ? &((PyVarObject *)self)->ob_size : NULL;
    view->strides = (flags & PyBUF_STRIDES) ? &int64_stride : NULL;
    return 0;
}

static PyObject *
trace_data(Trace *self, void *c)
{
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyObject *
trace_repr(Trace *self)
{
    return PyUnicode_FromFormat("<resettrace trace of %zd records>", trace_len(self));
}

/* The records of a list (each a sequence of RECORD_FIELDS ints) as a Trace, or NULL
 * with an error. */
static PyObject *
trace_of(PyObject *records)
{
    Py_ssize_t n = PyList_GET_SIZE(records);
    Trace *t = PyObject_NewVar(Trace, &TraceType, n * RECORD_FIELDS);
    if (t == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyList_CheckExact(r) || PyList_GET_SIZE(r) != RECORD_FIELDS) {
            PyObject *fast = PySequence_Fast(r, "a record is a sequence of ints");
            if (fast == NULL || PySequence_Fast_GET_SIZE(fast) != RECORD_FIELDS) {
                if (fast != NULL) {
                    PyErr_Format(PyExc_ValueError, "a record holds %d fields", RECORD_FIELDS);
                }
                Py_XDECREF(fast);
                Py_DECREF(t);
                return NULL;
            }
            for (int f = 0; f < RECORD_FIELDS; f++) {
                long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, f));
                if (x == -1 && PyErr_Occurred()) {
                    Py_DECREF(fast);
                    Py_DECREF(t);
                    return NULL;
                }
                t->v[i * RECORD_FIELDS + f] = x;
            }
            Py_DECREF(fast);
            continue;
        }
        for (int f = 0; f < RECORD_FIELDS; f++) {
            long long x = PyLong_AsLongLong(PyList_GET_ITEM(r, f));
            if (x == -1 && PyErr_Occurred()) {
                Py_DECREF(t);
                return NULL;
            }
            t->v[i * RECORD_FIELDS + f] = x;
        }
    }
    return (PyObject *)t;
}

static PyObject *
trace_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *records;
    if (!PyArg_ParseTuple(args, "O!:Trace", &PyList_Type, &records)) {
        return NULL;
    }
    return trace_of(records);
}

static PySequenceMethods trace_as_sequence = {
    .sq_length = (lenfunc)trace_len,
    .sq_item = (ssizeargfunc)trace_item,
};

static PyMappingMethods trace_as_mapping = {
    .mp_length = (lenfunc)trace_len,
    .mp_subscript = (binaryfunc)trace_subscript,
};

static PyBufferProcs trace_as_buffer = {
    .bf_getbuffer = (getbufferproc)trace_getbuffer,
};

static PyGetSetDef trace_getset[] = {
    {"data", (getter)trace_data, NULL, "the records' fields, flat int64 (a memoryview)", NULL},
    {NULL},
};

static PyTypeObject TraceType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.Trace",
    .tp_basicsize = offsetof(Trace, v),
    .tp_itemsize = sizeof(int64_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Trace(records): a finished trace, its records' fields in one int64 block.",
    .tp_as_sequence = &trace_as_sequence,
    .tp_as_mapping = &trace_as_mapping,
    .tp_as_buffer = &trace_as_buffer,
    .tp_getset = trace_getset,
    .tp_repr = (reprfunc)trace_repr,
    .tp_new = trace_new,
};

/* ---------------------------------------------------------------- Records */
/* A recorder's open trace: RECORD_FIELDS int64s per record in one block the recorder
 * keeps across its traces (it grows by doubling; up to RECORDS_KEPT records it is kept, so
 * a recorder in a steady state writes each record's six fields into memory it wrote the
 * trace before).
 * No Python object per record. Python code reads and writes it as a flat sequence of
 * ints (record j's field f at j * RECORD_FIELDS + f), appends records with
 * ``records += fields`` (any buffer or sequence of ints: array('q') in recorder.py) and
 * takes the finished trace with take(); recorder.py's _PyRecords (an array('q')) is the
 * same in Python. */
typedef struct {
    PyObject_HEAD
    int64_t *v;
    Py_ssize_t n;    /* the int64s held */
    Py_ssize_t cap;  /* the int64s allocated */
} Records;

static PyTypeObject RecordsType;

/* Room for `extra` more int64s: 0, or -1 with MemoryError. */
static int
records_reserve(Records *self, Py_ssize_t extra)
{
    if (self->n + extra <= self->cap) {
        return 0;
    }
    Py_ssize_t cap = self->cap ? self->cap : 64 * RECORD_FIELDS;
    while (cap < self->n + extra) {
        if (cap > PY_SSIZE_T_MAX / 16) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    int64_t *v = PyMem_Realloc(self->v, (size_t)cap * sizeof(int64_t));
    if (v == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->v = v;
    self->cap = cap;
    return 0;
}

/* Append the record [index, parent, 0, 0, count, 0] (room reserved by the caller): its
 * position. */
static inline Py_ssize_t
records_push(Records *self, Py_ssize_t index, Py_ssize_t parent, long long count)
{
    int64_t *r = self->v + self->n;
    r[R_PHASE] = index;
    r[R_PARENT] = parent;
    r[R_START] = 0;
    r[R_END] = 0;
    r[R_COUNT] = count;
    r[R_ERROR] = 0;
    self->n += RECORD_FIELDS;
    return self->n / RECORD_FIELDS - 1;
}

/* The records held. */
static inline Py_ssize_t
records_len(Records *self)
{
    return self->n / RECORD_FIELDS;
}

/* Field f of record j (j < records_len). */
#define FIELD(rs, j, f) ((rs)->v[(j) * RECORD_FIELDS + (f)])

static PyObject *
records_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) || (kwds && PyDict_GET_SIZE(kwds))) {
        PyErr_SetString(PyExc_TypeError, "Records() takes no arguments");
        return NULL;
    }
    return type->tp_alloc(type, 0);
}

static void
records_dealloc(Records *self)
{
    PyMem_Free(self->v);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static Py_ssize_t
records_length(Records *self)
{
    return self->n;
}

static PyObject *
records_item(Records *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "records index out of range");
        return NULL;
    }
    return PyLong_FromLongLong(self->v[i]);
}

static int
records_ass_item(Records *self, Py_ssize_t i, PyObject *value)
{
    if (value == NULL) {
        PyErr_SetString(PyExc_TypeError, "a record's field cannot be deleted");
        return -1;
    }
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "records assignment index out of range");
        return -1;
    }
    long long x = PyLong_AsLongLong(value);
    if (x == -1 && PyErr_Occurred()) {
        return -1;
    }
    self->v[i] = x;
    return 0;
}

/* records += fields: whole records of int64s (an array('q') or any buffer of them, or a
 * sequence of ints), all or nothing. */
static PyObject *
records_inplace_concat(Records *self, PyObject *other)
{
    Py_buffer b;
    if (PyObject_CheckBuffer(other) && PyObject_GetBuffer(other, &b, PyBUF_FORMAT) == 0) {
        int ok = b.itemsize == 8 && b.format != NULL
            && (strcmp(b.format, "q") == 0 || strcmp(b.format, "l") == 0
                || strcmp(b.format, "=q") == 0 || strcmp(b.format, "<q") == 0);
        Py_ssize_t k = b.len / 8;
        if (!ok || k % RECORD_FIELDS) {
            PyBuffer_Release(&b);
            PyErr_Format(PyExc_TypeError, "records take whole records of %d int64s",
                         RECORD_FIELDS);
            return NULL;
        }
        if (records_reserve(self, k) < 0) {
            PyBuffer_Release(&b);
            return NULL;
        }
        memcpy(self->v + self->n, b.buf, (size_t)k * 8);
        self->n += k;
        PyBuffer_Release(&b);
        return Py_NewRef(self);
    }
    PyErr_Clear();
    PyObject *fast = PySequence_Fast(other, "records take a sequence of ints");
    if (fast == NULL) {
        return NULL;
    }
    Py_ssize_t k = PySequence_Fast_GET_SIZE(fast);
    if (k % RECORD_FIELDS) {
        Py_DECREF(fast);
        PyErr_Format(PyExc_TypeError, "records take whole records of %d int64s",
                     RECORD_FIELDS);
        return NULL;
    }
    if (records_reserve(self, k) < 0) {
        Py_DECREF(fast);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < k; i++) {
        long long x = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
        if (x == -1 && PyErr_Occurred()) {
            Py_DECREF(fast);
            return NULL;  /* nothing appended: n moves below */
        }
        self->v[self->n + i] = x;
    }
    self->n += k;
    Py_DECREF(fast);
    return Py_NewRef(self);
}

/* A block kept across traces up to this many records (a trace larger than that, a scope
 * never exited, say, gives its memory back when it closes). */
#define RECORDS_KEPT 4096

/* The records as a Trace, this left empty; NULL with an error (the records kept).
 * `reuse`: a Trace to write them into instead of a new one (NULL: none), when nothing
 * else holds it and it has their length (a recorder's last trace, the usual trace having
 * the shape of the one before): no allocation, and memory written the trace before. */
static PyObject *
records_take_into(Records *self, PyObject *reuse)
{
    Trace *t;
    if (reuse != NULL && Py_IS_TYPE(reuse, &TraceType) && Py_REFCNT(reuse) == 1
            && Py_SIZE(reuse) == self->n && self->n > 0) {
        t = (Trace *)Py_NewRef(reuse);
    }
    else {
        t = PyObject_NewVar(Trace, &TraceType, self->n);
        if (t == NULL) {
            return NULL;
        }
    }
    if (self->n) {
        memcpy(t->v, self->v, (size_t)self->n * sizeof(int64_t));
    }
    self->n = 0;
    if (self->cap > RECORDS_KEPT * RECORD_FIELDS) {
        PyMem_Free(self->v);
        self->v = NULL;
        self->cap = 0;
    }
    return (PyObject *)t;
}

static PyObject *
records_take(Records *self, PyObject *Py_UNUSED(ignored))
{
    return records_take_into(self, NULL);
}

static PyObject *
records_clear(Records *self, PyObject *Py_UNUSED(ignored))
{
    self->n = 0;
    if (self->cap > RECORDS_KEPT * RECORD_FIELDS) {
        PyMem_Free(self->v);
        self->v = NULL;
        self->cap = 0;
    }
    Py_RETURN_NONE;
}

static PyObject *
records_repr(Records *self)
{
    return PyUnicode_FromFormat("<resettrace records: %zd open>", records_len(self));
}

static PySequenceMethods records_as_sequence = {
    .sq_length = (lenfunc)records_length,
    .sq_item = (ssizeargfunc)records_item,
    .sq_ass_item = (ssizeobjargproc)records_ass_item,
    .sq_inplace_concat = (binaryfunc)records_inplace_concat,
};

static PyMethodDef records_methods[] = {
    {"take", (PyCFunction)records_take, METH_NOARGS,
     "take(): the records as a Trace, this left empty (at once)."},
    {"clear", (PyCFunction)records_clear, METH_NOARGS, "clear(): no records."},
    {NULL},
};

static PyTypeObject RecordsType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.Records",
    .tp_basicsize = sizeof(Records),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Records(): a recorder's open trace, RECORD_FIELDS int64s per record.",
    .tp_as_sequence = &records_as_sequence,
    .tp_methods = records_methods,
    .tp_repr = (reprfunc)records_repr,
    .tp_new = records_new,
    .tp_dealloc = (destructor)records_dealloc,
};

/* ---------------------------------------------------------------- TraceQueue */
/* A sink's queue of finished traces that a trace closed in C goes into directly, with no
 * call of the sink's on_trace, while it holds fewer than `limit` (the sink sets limit: 0
 * sends every trace to on_trace). A FIFO of objects: append, popleft, len, clear.
 *
 * A `keyed` queue holds only traces of one recorder (its `key`, set by the first trace
 * queued), each ending before `deadline` (ns, the records' clock): any other trace goes to
 * on_trace, which takes the queue's traces first (`take()`: their key with them, at once).
 * (The sink takes them too before that recorder's attributes change.) */
typedef struct {
    PyObject_HEAD
    PyObject **items;
    Py_ssize_t cap, head, size, limit;
    PyObject *key;  /* keyed: the recorder of the traces queued (NULL: none) */
    long long deadline;
    int keyed;
} TraceQueue;

static PyTypeObject TraceQueueType;

static int
tq_traverse(TraceQueue *self, visitproc visit, void *arg)
{
    for (Py_ssize_t k = 0; k < self->size; k++) {
        Py_VISIT(self->items[(self->head + k) % self->cap]);
    }
    Py_VISIT(self->key);
    return 0;
}

static int
tq_clear_items(TraceQueue *self)
{
    while (self->size > 0) {
        PyObject *o = self->items[self->head];
        self->items[self->head] = NULL;
        self->head = (self->head + 1) % self->cap;
        self->size--;
        Py_DECREF(o);
    }
    self->head = 0;
    Py_CLEAR(self->key);
    return 0;
}

static void
tq_dealloc(TraceQueue *self)
{
    PyObject_GC_UnTrack(self);
    tq_clear_items(self);
    PyMem_Free(self->items);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
tq_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    TraceQueue *self = (TraceQueue *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->cap = 64;
    self->items = PyMem_Calloc(self->cap, sizeof(PyObject *));
    if (self->items == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    return (PyObject *)self;
}

/* Append o (a new reference taken); 0, or -1 with an error. */
static int
tq_push(TraceQueue *self, PyObject *o)
{
    if (self->size == self->cap) {
        Py_ssize_t cap = self->cap * 2;
        PyObject **items = PyMem_Calloc(cap, sizeof(PyObject *));
        if (items == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        for (Py_ssize_t k = 0; k < self->size; k++) {
            items[k] = self->items[(self->head + k) % self->cap];
        }
        PyMem_Free(self->items);
        self->items = items;
        self->cap = cap;
        self->head = 0;
    }
    self->items[(self->head + self->size) % self->cap] = Py_NewRef(o);
    self->size++;
    return 0;
}

static PyObject *
tq_append(TraceQueue *self, PyObject *o)
{
    if (tq_push(self, o) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
tq_popleft(TraceQueue *self, PyObject *Py_UNUSED(ignored))
{
    if (self->size == 0) {
        PyErr_SetString(PyExc_IndexError, "pop from an empty queue");
        return NULL;
    }
    PyObject *o = self->items[self->head];
    self->items[self->head] = NULL;
    self->head = (self->head + 1) % self->cap;
    self->size--;
    return o;
}

static PyObject *
tq_clear(TraceQueue *self, PyObject *Py_UNUSED(ignored))
{
    tq_clear_items(self);
    Py_RETURN_NONE;
}

/* (key, [every trace queued, oldest first]), the queue left empty and without a key: in
 * one step, so that no trace closed meanwhile (another thread, a signal handler) is taken
 * with the key of others. */
static PyObject *
tq_take(TraceQueue *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *items = PyList_New(self->size);
    if (items == NULL) {
        return NULL;
    }
    for (Py_ssize_t k = 0; k < PyList_GET_SIZE(items); k++) {
        PyObject *o = self->items[self->head];
        self->items[self->head] = NULL;
        self->head = (self->head + 1) % self->cap;
        self->size--;
        PyList_SET_ITEM(items, k, o);  /* the queue's reference */
    }
    self->head = 0;
    PyObject *key = self->key ? self->key : Py_NewRef(Py_None);
    self->key = NULL;
    PyObject *out = PyTuple_Pack(2, key, items);
    Py_DECREF(key);
    Py_DECREF(items);
    return out;
}

/* A trace of rec closing in C goes into the queue (below its limit already): 1, or 0 (it
 * goes to the sink's on_trace). */
static int
tq_admits(TraceQueue *self, PyObject *rec, PyObject *trace)
{
    if (!self->keyed) {
        return 1;
    }
    if (Py_SIZE(trace) < RECORD_FIELDS
            || ((Trace *)trace)->v[R_END] >= self->deadline) {
        return 0;  /* the root's end: no clock read of its own */
    }
    if (self->size == 0) {
        Py_XSETREF(self->key, Py_NewRef(rec));
        return 1;
    }
    return self->key == rec;
}

static Py_ssize_t
tq_len(TraceQueue *self)
{
    return self->size;
}

static PyMethodDef tq_methods[] = {
    {"append", (PyCFunction)tq_append, METH_O, "append(trace): at the end."},
    {"popleft", (PyCFunction)tq_popleft, METH_NOARGS, "The first trace (IndexError: none)."},
    {"clear", (PyCFunction)tq_clear, METH_NOARGS, "Drop every trace."},
    {"take", (PyCFunction)tq_take, METH_NOARGS,
     "(key, [the traces queued, oldest first]), the queue left empty and without a key."},
    {NULL},
};

static PyMemberDef tq_members[] = {
    {"limit", T_PYSSIZET, offsetof(TraceQueue, limit), 0,
     "traces a closing trace is appended below (else it goes to the sink's on_trace)"},
    {"keyed", T_INT, offsetof(TraceQueue, keyed), 0,
     "true: the traces queued are of one recorder (take() returns it), each ending before "
     "deadline"},
    {"deadline", T_LONGLONG, offsetof(TraceQueue, deadline), 0,
     "keyed: a trace ending at or after this (ns, the records' clock) goes to on_trace"},
    {NULL},
};

static PySequenceMethods tq_as_sequence = {
    .sq_length = (lenfunc)tq_len,
};

static PyTypeObject TraceQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.TraceQueue",
    .tp_basicsize = sizeof(TraceQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "A sink's FIFO of finished traces that the compiled recorder appends to.",
    .tp_traverse = (traverseproc)tq_traverse,
    .tp_clear = (inquiry)tq_clear_items,
    .tp_dealloc = (destructor)tq_dealloc,
    .tp_new = tq_new,
    .tp_methods = tq_methods,
    .tp_members = tq_members,
    .tp_as_sequence = &tq_as_sequence,
};

/* ---------------------------------------------------------------- TraceLog */
/* A sink's log of finished traces kept as int64s (no object per trace): their records'
 * fields one trace after another, and each trace's record count. A trace closed in C is
 * appended while the log holds fewer than `limit` traces (the sink sets limit: 0 sends
 * every trace to its on_trace), except the one that would make `wake` traces (0: none),
 * which goes to on_trace (a sink's wake-up of its thread, once per batch). A trace that
 * another sink holds too (an exporter's queue) is kept by reference instead, no copy
 * made (tl_push_ref). Python appends a copy of a Trace with append(). take() hands the
 * whole log over as two bytes objects, (fields, record counts), and empties it, in one
 * step: no trace closed meanwhile (another thread, a signal handler) is lost or taken
 * twice. recorder.py's _PyTraceLog is the same in Python. */
typedef struct {
    PyObject_HEAD
    int64_t *v;        /* the fields of the traces kept as copies */
    int64_t *lens;     /* each trace's record count */
    PyObject **refs;   /* each trace kept by reference (NULL: its fields are in v) */
    Py_ssize_t n, cap;             /* int64s of fields written, allocated */
    Py_ssize_t size, lens_cap;     /* traces written, counts (and refs) allocated */
    Py_ssize_t head, head_n;       /* traces taken from the front, and their int64s in v */
    Py_ssize_t held;               /* traces kept by reference */
    Py_ssize_t limit, wake;
} TraceLog;

static PyTypeObject TraceLogType;

/* a log past this many int64s gives its blocks back when emptied (a burst kept no longer) */
#define TRACE_LOG_KEPT (1 << 20)

static inline Py_ssize_t
tl_count(TraceLog *self)
{
    return self->size - self->head;
}

/* Drop the references held (Trace objects: no Python code runs). */
static void
tl_release(TraceLog *self)
{
    for (Py_ssize_t k = self->head; self->held > 0 && k < self->size; k++) {
        if (self->refs[k] != NULL) {
            Py_CLEAR(self->refs[k]);
            self->held--;
        }
    }
    self->held = 0;
}

static void
tl_free(TraceLog *self)
{
    tl_release(self);
    PyMem_Free(self->v);
    PyMem_Free(self->lens);
    PyMem_Free(self->refs);
    self->v = self->lens = NULL;
    self->refs = NULL;
    self->n = self->cap = self->size = self->lens_cap = self->head = self->head_n = 0;
}

/* The traces not taken moved to the front (before the blocks grow). */
static void
tl_compact(TraceLog *self)
{
    if (self->head == 0) {
        return;
    }
    memmove(self->v, self->v + self->head_n,
            (size_t)(self->n - self->head_n) * sizeof(int64_t));
    memmove(self->lens, self->lens + self->head,
            (size_t)(self->size - self->head) * sizeof(int64_t));
    memmove(self->refs, self->refs + self->head,
            (size_t)(self->size - self->head) * sizeof(PyObject *));
    self->n -= self->head_n;
    self->size -= self->head;
    self->head = self->head_n = 0;
}

/* Room for one more trace's count and reference: 0, or -1 with MemoryError. */
static int
tl_reserve(TraceLog *self)
{
    if (self->size < self->lens_cap) {
        return 0;
    }
    tl_compact(self);
    if (self->size < self->lens_cap) {
        return 0;
    }
    Py_ssize_t cap = self->lens_cap ? self->lens_cap * 2 : 256;
    int64_t *lens = PyMem_Realloc(self->lens, (size_t)cap * sizeof(int64_t));
    if (lens == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->lens = lens;
    PyObject **refs = PyMem_Realloc(self->refs, (size_t)cap * sizeof(PyObject *));
    if (refs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    self->refs = refs;
    self->lens_cap = cap;
    return 0;
}

static void
tl_dealloc(TraceLog *self)
{
    tl_free(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
tl_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    return type->tp_alloc(type, 0);
}

/* Append one trace's n int64s (whole records): 0, or -1 with MemoryError (nothing
 * appended). */
static int
tl_push(TraceLog *self, const int64_t *v, Py_ssize_t n)
{
    if (tl_reserve(self) < 0) {
        return -1;
    }
    if (self->n + n > self->cap) {
        tl_compact(self);
    }
    if (self->n + n > self->cap) {
        Py_ssize_t cap = self->cap ? self->cap : 4096;
        while (cap < self->n + n) {
            cap *= 2;
        }
        int64_t *grown = PyMem_Realloc(self->v, (size_t)cap * sizeof(int64_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        self->v = grown;
        self->cap = cap;
    }
    memcpy(self->v + self->n, v, (size_t)n * sizeof(int64_t));
    self->n += n;
    self->refs[self->size] = NULL;
    self->lens[self->size++] = n / RECORD_FIELDS;
    return 0;
}

/* Append a Trace by reference (one that another sink holds too: no copy): 0, or -1 with
 * MemoryError. */
static int
tl_push_ref(TraceLog *self, PyObject *trace)
{
    if (tl_reserve(self) < 0) {
        return -1;
    }
    self->refs[self->size] = Py_NewRef(trace);
    self->held++;
    self->lens[self->size++] = Py_SIZE(trace) / RECORD_FIELDS;
    return 0;
}

static PyObject *
tl_append(TraceLog *self, PyObject *trace)
{
    if (!Py_IS_TYPE(trace, &TraceType)) {
        PyErr_Format(PyExc_TypeError, "a TraceLog holds Trace objects, not %.100s",
                     Py_TYPE(trace)->tp_name);
        return NULL;
    }
    if (tl_push(self, ((Trace *)trace)->v, Py_SIZE(trace)) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
}

/* take([max]): the first max traces (all: none given or < 1), the rest kept: a consumer
 * taking a bounded batch at a time copies into a block of that size, the one it freed the
 * batch before (a whole log taken at once after the thread was held up is a block of
 * megabytes written cold). */
static PyObject *
tl_take(TraceLog *self, PyObject *args)
{
    Py_ssize_t most = 0;
    if (!PyArg_ParseTuple(args, "|n:take", &most)) {
        return NULL;
    }
    Py_ssize_t k = tl_count(self);
    if (most > 0 && most < k) {
        k = most;
    }
    Py_ssize_t end = self->head + k, total = 0, inline_n = 0, refs = 0;
    for (Py_ssize_t j = self->head; j < end; j++) {
        Py_ssize_t m = self->lens[j] * RECORD_FIELDS;
        total += m;
        if (self->held > 0 && self->refs[j] != NULL) {
            refs++;
        }
        else {
            inline_n += m;
        }
    }
    const int64_t *from = self->v + self->head_n;
    PyObject *fields = PyBytes_FromStringAndSize(
        refs ? NULL : (const char *)from, total * (Py_ssize_t)sizeof(int64_t));
    PyObject *lens = fields == NULL ? NULL : PyBytes_FromStringAndSize(
        (const char *)(self->lens + self->head), k * (Py_ssize_t)sizeof(int64_t));
    if (lens == NULL) {
        Py_XDECREF(fields);
        return NULL;  /* the log kept whole */
    }
    if (refs) {  /* the traces in order, copies and references alike */
        int64_t *to = (int64_t *)PyBytes_AS_STRING(fields);
        for (Py_ssize_t j = self->head; j < end; j++) {
            Py_ssize_t m = self->lens[j] * RECORD_FIELDS;
            if (self->refs[j] != NULL) {
                memcpy(to, ((Trace *)self->refs[j])->v, (size_t)m * sizeof(int64_t));
                Py_CLEAR(self->refs[j]);  /* (a Trace: no Python code runs) */
                self->held--;
            }
            else {
                memcpy(to, from, (size_t)m * sizeof(int64_t));
                from += m;
            }
            to += m;
        }
    }
    /* (no Python code ran since the bytes were filled: nothing was appended meanwhile) */
    self->head = end;
    self->head_n += inline_n;
    if (self->head == self->size) {  /* emptied: from the start again */
        if (self->cap > TRACE_LOG_KEPT) {
            tl_free(self);
        }
        self->n = self->size = self->head = self->head_n = 0;
    }
    PyObject *out = PyTuple_Pack(2, fields, lens);
    Py_DECREF(fields);
    Py_DECREF(lens);
    return out;
}

static PyObject *
tl_clear(TraceLog *self, PyObject *Py_UNUSED(ignored))
{
    tl_free(self);
    Py_RETURN_NONE;
}

static Py_ssize_t
tl_len(TraceLog *self)
{
    return tl_count(self);
}

static PyMethodDef tl_methods[] = {
    {"append", (PyCFunction)tl_append, METH_O, "append(trace): at the end."},
    {"take", (PyCFunction)tl_take, METH_VARARGS,
     "take([max]) -> (fields, record counts): the first max traces' fields (every trace's: "
     "no max) one after another and each one's record count, int64s in two bytes objects, "
     "taken from the log at once."},
    {"clear", (PyCFunction)tl_clear, METH_NOARGS, "Drop every trace."},
    {NULL},
};

static PyMemberDef tl_members[] = {
    {"limit", T_PYSSIZET, offsetof(TraceLog, limit), 0,
     "traces a closing trace is appended below (else it goes to the sink's on_trace)"},
    {"wake", T_PYSSIZET, offsetof(TraceLog, wake), 0,
     "the trace that would make this many goes to the sink's on_trace (0: none)"},
    {NULL},
};

static PySequenceMethods tl_as_sequence = {
    .sq_length = (lenfunc)tl_len,
};

static PyTypeObject TraceLogType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.TraceLog",
    .tp_basicsize = sizeof(TraceLog),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A sink's log of finished traces as int64s that the compiled recorder "
              "appends to.",
    .tp_dealloc = (destructor)tl_dealloc,
    .tp_new = tl_new,
    .tp_methods = tl_methods,
    .tp_members = tl_members,
    .tp_as_sequence = &tl_as_sequence,
};

/* ---------------------------------------------------------------- Slot */
/* The thread's current recorder (recorder.CURRENT's slot): a C thread-local, read and set
 * in place by the hot path (a threading.local costs a per-thread dict lookup each way).
 * Python reads and sets it as the attribute `value` of the one Slot object. A thread that
 * ends with a recorder bound keeps a reference to it (none is bound between traces). */
static _Thread_local PyObject *tls_current = NULL;  /* NULL: None */

static inline PyObject *
current_borrowed(void)
{
    return tls_current ? tls_current : Py_None;
}

static inline void
set_current(PyObject *v)
{
    PyObject *old = tls_current;
    tls_current = v == Py_None || v == NULL ? NULL : Py_NewRef(v);
    Py_XDECREF(old);
}

typedef struct {
    PyObject_HEAD
} Slot;

static PyObject *
slot_get_value(Slot *self, void *c)
{
    return Py_NewRef(current_borrowed());
}

static int
slot_set_value(Slot *self, PyObject *v, void *c)
{
    set_current(v);
    return 0;
}

static PyGetSetDef slot_getset[] = {
    {"value", (getter)slot_get_value, (setter)slot_set_value,
     "this thread's current recorder, or None", NULL},
    {NULL},
};

static PyTypeObject SlotType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.Slot",
    .tp_basicsize = sizeof(Slot),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The thread's current recorder, as the attribute value (a C thread-local).",
    .tp_getset = slot_getset,
    .tp_new = PyType_GenericNew,
};

/* ---------------------------------------------------------------- RecorderBase */
#define SCOPE_SEEN 64  /* a power of 2 */
/* The state of a recorder that the hot path reads: the base of recorder.Recorder (its
 * Python subclass adds the routing and the rest). The C code reads these fields in place;
 * Python code reads them as the members _stack, _records, _laps, _scopes, _named, _owner
 * and _serial. What the C code hands to Python it was given by setup_recorder(). */
typedef struct {
    PyObject_HEAD
    PyObject *stack;      /* positions of the open records (a list of ints) */
    PyObject *records;    /* the open trace's records (a Records, kept across traces) */
    PyObject *laps;       /* positions of the running laps, each also on the stack */
    PyObject *scopes;     /* one Scope per phase index (a list) */
    PyObject *named;      /* span name -> Scope (a dict) */
    PyObject *token;      /* (the thread's current recorder before the open trace,) or None */
    PyObject *last;       /* the last trace handed over (a Trace) */
    PyObject *sinks;      /* what each finished trace is handed to (a tuple) */
    unsigned long owner;  /* the thread that records here */
    long long serial;     /* the traces closed: a call that finds it changed on return
                           * knows its trace was cut meanwhile (an overflow) */
    /* phase -> its Scope, by identity (both held): a scope() call reads one entry, not
     * the phase's index attribute, the scopes list or the names dict */
    struct { PyObject *phase, *scope; } seen[SCOPE_SEEN];
} RecorderBase;

static void
rb_forget(RecorderBase *self)
{
    for (int i = 0; i < SCOPE_SEEN; i++) {
        Py_CLEAR(self->seen[i].phase);
        Py_CLEAR(self->seen[i].scope);
    }
}

static PyTypeObject RecorderBaseType;
/* what setup_recorder() gives: the Python implementations of every case */
static PyObject *scope_general;   /* Recorder._scope_general(rec, phase, count, lap) */
static PyObject *enter_general;   /* the Python Scope.__enter__ */
static PyObject *exit_general;    /* the Python Scope.__exit__ */
static PyObject *lap_general;     /* the Python Scope.lap */
static PyObject *timing_general;  /* the Python Scope.timing */
static PyObject *sink_failed;     /* sink_failed(exc): logs a trace sink's exception */

static int
rb_traverse(RecorderBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->stack);
    Py_VISIT(self->records);
    Py_VISIT(self->laps);
    Py_VISIT(self->scopes);
    Py_VISIT(self->named);
    Py_VISIT(self->token);
    Py_VISIT(self->last);
    Py_VISIT(self->sinks);
    for (int i = 0; i < SCOPE_SEEN; i++) {
        Py_VISIT(self->seen[i].phase);
        Py_VISIT(self->seen[i].scope);
    }
    return 0;
}

static int
rb_clear(RecorderBase *self)
{
    Py_CLEAR(self->stack);
    Py_CLEAR(self->records);
    Py_CLEAR(self->laps);
    Py_CLEAR(self->scopes);
    Py_CLEAR(self->named);
    Py_CLEAR(self->token);
    Py_CLEAR(self->last);
    Py_CLEAR(self->sinks);
    rb_forget(self);
    return 0;
}

static void
rb_dealloc(RecorderBase *self)
{
    PyObject_GC_UnTrack(self);
    rb_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
rb_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    RecorderBase *self = (RecorderBase *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->stack = PyList_New(0);
    self->records = PyObject_CallNoArgs((PyObject *)&RecordsType);
    self->laps = PyList_New(0);
    self->scopes = PyList_New(0);
    self->named = PyDict_New();
    self->token = Py_NewRef(Py_None);
    self->last = (PyObject *)PyObject_NewVar(Trace, &TraceType, 0);
    self->sinks = PyTuple_New(0);
    self->owner = PyThread_get_thread_ident();
    if (!self->stack || !self->records || !self->laps || !self->scopes || !self->named
            || !self->last || !self->sinks) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static int
rb_set_list(PyObject **field, PyObject *v, const char *name)
{
    if (v == NULL || !PyList_CheckExact(v)) {
        PyErr_Format(PyExc_TypeError, "%s must be a list", name);
        return -1;
    }
    Py_SETREF(*field, Py_NewRef(v));
    return 0;
}

#define RB_LIST(field, name) \
    static PyObject *rb_get_##field(RecorderBase *self, void *c) { return Py_NewRef(self->field); } \
    static int rb_set_##field(RecorderBase *self, PyObject *v, void *c) \
    { return rb_set_list(&self->field, v, name); }
RB_LIST(stack, "_stack")
RB_LIST(laps, "_laps")
#undef RB_LIST

static PyObject *
rb_get_scopes(RecorderBase *self, void *c)
{
    return Py_NewRef(self->scopes);
}

static int
rb_set_scopes(RecorderBase *self, PyObject *v, void *c)
{
    if (rb_set_list(&self->scopes, v, "_scopes") < 0) {
        return -1;
    }
    rb_forget(self);  /* another list: other scopes */
    return 0;
}

static PyObject *
rb_get_records(RecorderBase *self, void *c)
{
    return Py_NewRef(self->records);
}

static int
rb_set_records(RecorderBase *self, PyObject *v, void *c)
{
    if (v == NULL || !Py_IS_TYPE(v, &RecordsType)) {
        PyErr_SetString(PyExc_TypeError, "_records must be a Records");
        return -1;
    }
    Py_SETREF(self->records, Py_NewRef(v));
    return 0;
}

static PyObject *
rb_get_named(RecorderBase *self, void *c)
{
    return Py_NewRef(self->named);
}

static PyObject *
rb_get_owner(RecorderBase *self, void *c)
{
    return PyLong_FromUnsignedLong(self->owner);
}

static int
rb_set_owner(RecorderBase *self, PyObject *v, void *c)
{
    unsigned long o = v == NULL ? (unsigned long)-1 : PyLong_AsUnsignedLong(v);
    if (o == (unsigned long)-1 && PyErr_Occurred()) {
        return -1;
    }
    self->owner = o;
    return 0;
}

static PyGetSetDef rb_getset[] = {
    {"_stack", (getter)rb_get_stack, (setter)rb_set_stack, NULL, NULL},
    {"_records", (getter)rb_get_records, (setter)rb_set_records, NULL, NULL},
    {"_laps", (getter)rb_get_laps, (setter)rb_set_laps, NULL, NULL},
    {"_scopes", (getter)rb_get_scopes, (setter)rb_set_scopes, NULL, NULL},
    {"_named", (getter)rb_get_named, NULL, NULL, NULL},
    {"_owner", (getter)rb_get_owner, (setter)rb_set_owner, NULL, NULL},
    {NULL},
};

static PyMemberDef rb_members[] = {
    {"_token", T_OBJECT_EX, offsetof(RecorderBase, token), 0, NULL},
    {"_last", T_OBJECT_EX, offsetof(RecorderBase, last), 0, NULL},
    {"_sinks", T_OBJECT_EX, offsetof(RecorderBase, sinks), 0, NULL},
    {"_serial", T_LONGLONG, offsetof(RecorderBase, serial), 0, NULL},
    {NULL},
};

/* ---------------------------------------------------------------- ScopeBase */
typedef struct {
    PyObject_HEAD
    PyObject *rec;
    Py_ssize_t index;
    PyObject *count;      /* as given: an int, or a float or numpy int the stats take */
    Py_ssize_t first;
    Py_ssize_t pos;
    PyObject *stack;
    PyObject *records;
    PyObject *laps;
    PyObject *layout;
    char armed;           /* scope() gave it a count no __enter__ took yet */
    PyObject *stash;      /* earlier scope() calls' (count, first) waiting, or None/NULL */
} ScopeBase;

static PyTypeObject ScopeBaseType;

static int
scope_traverse(ScopeBase *self, visitproc visit, void *arg)
{
    Py_VISIT(self->rec);
    Py_VISIT(self->count);
    Py_VISIT(self->stack);
    Py_VISIT(self->records);
    Py_VISIT(self->laps);
    Py_VISIT(self->layout);
    Py_VISIT(self->stash);
    return 0;
}

static int
scope_clear(ScopeBase *self)
{
    Py_CLEAR(self->rec);
    Py_CLEAR(self->count);
    Py_CLEAR(self->stack);
    Py_CLEAR(self->records);
    Py_CLEAR(self->laps);
    Py_CLEAR(self->layout);
    Py_CLEAR(self->stash);
    return 0;
}

static void
scope_dealloc(ScopeBase *self)
{
    /* a heap subclass's instance: subtype_dealloc drops the type's reference */
    PyObject_GC_UnTrack(self);
    scope_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
scope_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    ScopeBase *self = (ScopeBase *)type->tp_alloc(type, 0);
    if (self != NULL) {
        self->count = Py_NewRef(no_count);
        self->first = -1;
        self->pos = -1;
    }
    return (PyObject *)self;
}

/* An int item of a list, as a C value; -2 (and no error) if it is not a small int. */
static inline Py_ssize_t
int_at(PyObject *list, Py_ssize_t i)
{
    PyObject *v = PyList_GET_ITEM(list, i);
    if (!PyLong_CheckExact(v)) {
        return -2;
    }
    Py_ssize_t x = PyLong_AsSsize_t(v);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return -2;
    }
    return x;
}

/* Drop the last k items of a list (k <= its size), as list.pop() does, without a slice
 * assignment; a shorter list keeps its allocation. */
static void
list_drop(PyObject *list, Py_ssize_t k)
{
    Py_ssize_t n = PyList_GET_SIZE(list);
    if (k > n) {
        k = n;  /* Python code run meanwhile (a signal handler, a finalizer) shrank it */
    }
    for (Py_ssize_t i = n - 1; i >= n - k; i--) {
        PyObject *v = PyList_GET_ITEM(list, i);
        PyList_SET_ITEM(list, i, NULL);
        Py_SET_SIZE(list, i);
        Py_DECREF(v);
    }
}

/* A tuple of the cyclic GC's whose allocation runs no collection. A collection runs
 * Python code (gc callbacks, finalizers, weakref callbacks), and with it any signal
 * handler that is due: one that records would push its scopes between this path's read
 * of the recorder's state and its writes to it (the record then pushed at a stale
 * position: its scope never closed, the handler's left open). The collection is only put
 * off to the next allocation. (Records, positions and clocks are no objects of the GC's.) */
static inline PyObject *
tuple_no_collection(PyObject *a)
{
    int was = PyGC_Disable();
    PyObject *o = PyTuple_Pack(1, a);
    if (was) {
        PyGC_Enable();
    }
    return o;
}

/* Whether o is a recorder's Records (else the Python method takes the case). */
static inline int
is_records(PyObject *o)
{
    return o != NULL && Py_IS_TYPE(o, &RecordsType);
}

/* The phase of record pos, or -2 when there is none. */
static inline Py_ssize_t
record_phase(Records *rs, Py_ssize_t pos)
{
    return pos >= 0 && pos < records_len(rs) ? (Py_ssize_t)FIELD(rs, pos, R_PHASE) : -2;
}

/* Push position pos on a list (the stack, the laps): 0, or -1 with an error. */
static inline int
push_pos(PyObject *list, Py_ssize_t pos)
{
    PyObject *p = PyLong_FromSsize_t(pos);  /* (a cached small int up to 256) */
    if (p == NULL) {
        return -1;
    }
    int out = PyList_Append(list, p);
    Py_DECREF(p);
    return out;
}

/* A count as a record holds it: 1 and *out, for an int in [-1, 2**63); else 0 (no
 * error): count_of reads it. */
static inline int
count_value(PyObject *c, long long *out)
{
    if (!PyLong_CheckExact(c)) {
        return 0;
    }
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(c, &overflow);
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    *out = x;
    return overflow == 0 && x >= -1;
}

/* The int code of an error code object (error_code's), or 0 (no error) if it is none. */
static inline long long
code_value(PyObject *code)
{
    long long x = code != NULL && PyLong_CheckExact(code) ? PyLong_AsLongLong(code) : 0;
    if (x == -1 && PyErr_Occurred()) {
        PyErr_Clear();
        return 0;
    }
    return x;
}

/* The pending slow path: the Python implementation given by setup_recorder(). */
COLD static PyObject *
call_general(PyObject *fn, PyObject *const *args, size_t n)
{
    if (fn == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "resettrace._fast: setup_recorder() not called");
        return NULL;
    }
    return PyObject_Vectorcall(fn, args, n, NULL);
}

/* A trace opens on rec: the thread's current recorder is rec until it closes (the one
 * before is kept in rec's token), as Recorder's Python code does. 0, or -1 with an error. */
static int
open_trace(RecorderBase *rec)
{
    PyObject *token = tuple_no_collection(current_borrowed());
    if (token == NULL) {
        return -1;
    }
    Py_SETREF(rec->token, token);
    set_current((PyObject *)rec);
    return 0;
}

/* obj.name as a new reference in *out, or NULL there with no error when obj has no such
 * attribute: 1, 0, or -1 with an error (CPython's lookup that makes no AttributeError). */
static inline int
lookup_attr(PyObject *obj, PyObject *name, PyObject **out)
{
#if PY_VERSION_HEX >= 0x030D0000
    return PyObject_GetOptionalAttr(obj, name, out);
#else
    return _PyObject_LookupAttr(obj, name, out);
#endif
}

/* close_trace's sinks whose trace_queue it looks up once (any after them: twice) */
#define SINKS_SEEN 8

/* The sink's on_trace(trace, rec): 0, also when it raised an Exception (logged by
 * sink_failed, never raised: a sink must not break training); -1 with any other exception
 * pending (SystemExit from a SIGTERM handler, KeyboardInterrupt), which leaves. */
static int
call_sink(PyObject *sink, PyObject *trace, RecorderBase *rec)
{
    PyObject *r = PyObject_CallMethodObjArgs(sink, str_on_trace, trace, (PyObject *)rec,
                                             NULL);
    if (r != NULL) {
        Py_DECREF(r);
        return 0;
    }
    if (!PyErr_ExceptionMatches(PyExc_Exception)) {
        return -1;
    }
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (value != NULL && tb != NULL) {
        PyException_SetTraceback(value, tb);
    }
    PyObject *done = sink_failed && value ? PyObject_CallOneArg(sink_failed, value) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (done == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_Exception)) {
            return -1;  /* the logging was cut by SystemExit: it leaves */
        }
        PyErr_WriteUnraisable((PyObject *)rec);
    }
    Py_XDECREF(done);
    return 0;
}

/* The trace's outermost scope closed (Recorder._close_trace's common case, with no
 * exception pending): the thread's current recorder is again the one before, and the
 * trace goes to the sinks (a copy: the Records block is reused). A sink's Exception is
 * logged (sink_failed), never raised: it must not break training; any other exception
 * (SystemExit from a SIGTERM handler, KeyboardInterrupt) leaves as Python's would: -1,
 * with it pending. */
static int
close_trace(RecorderBase *rec)
{
    PyObject *token = rec->token;
    rec->token = Py_NewRef(Py_None);
    if (PyTuple_CheckExact(token) && PyTuple_GET_SIZE(token) == 1) {
        set_current(PyTuple_GET_ITEM(token, 0));
    }
    Py_DECREF(token);
    if (!is_records(rec->records) || ((Records *)rec->records)->n == 0) {
        return 0;  /* handed over already */
    }
    /* one copy, into the last trace when nothing else holds it */
    PyObject *trace = records_take_into((Records *)rec->records, rec->last);
    rec->serial++;
    if (trace == NULL) {  /* no memory for the copy: the trace is dropped, said */
        ((Records *)rec->records)->n = 0;
        PyErr_WriteUnraisable((PyObject *)rec);
        return 0;
    }
    Py_SETREF(rec->last, Py_NewRef(trace));
    PyObject *sinks = Py_NewRef(rec->sinks);
    int out = 0;
    /* the sinks with a log, taken after the others: a trace another sink holds by then is
     * logged by reference, any other as a copy of its int64s (the recorder writes its next
     * trace into it) */
    int logged = 0;
    PyObject *logs[SINKS_SEEN] = {NULL};  /* the first sinks' logs, found in the first pass */
    for (int pass = 0; pass < 2 && out == 0; pass++) {
        for (Py_ssize_t i = 0; PyTuple_CheckExact(sinks) && i < PyTuple_GET_SIZE(sinks); i++) {
            PyObject *sink = PyTuple_GET_ITEM(sinks, i);
            PyObject *q = NULL;
            if (pass == 1 && i < SINKS_SEEN) {
                q = logs[i];  /* (its reference) */
                logs[i] = NULL;
                if (q == NULL) {
                    continue;  /* a sink of the first pass */
                }
            }
            /* no AttributeError made and dropped per trace for a sink without a queue */
            else if (lookup_attr(sink, str_trace_queue, &q) < 0) {
                PyErr_Clear();
            }
            int is_log = q != NULL && Py_IS_TYPE(q, &TraceLogType);
            if (is_log != pass) {
                logged += is_log;
                if (is_log && i < SINKS_SEEN) {
                    logs[i] = q;  /* kept for the second pass */
                }
                else {
                    Py_XDECREF(q);
                }
                continue;  /* the other pass's */
            }
            int pushed = -1;
            if (is_log) {
                TraceLog *lg = (TraceLog *)q;
                if (tl_count(lg) < lg->limit && tl_count(lg) + 1 != lg->wake) {
                    pushed = Py_REFCNT(trace) > 2 ? tl_push_ref(lg, trace)  /* shared */
                        : tl_push(lg, ((Trace *)trace)->v, Py_SIZE(trace));
                }
            }
            else if (q != NULL && Py_IS_TYPE(q, &TraceQueueType)
                    && ((TraceQueue *)q)->size < ((TraceQueue *)q)->limit
                    && tq_admits((TraceQueue *)q, (PyObject *)rec, trace)) {
                pushed = tq_push((TraceQueue *)q, trace);  /* published: no call */
            }
            if (pushed < 0 && PyErr_Occurred()) {
                PyErr_Clear();  /* no memory: the sink's own method tries */
            }
            Py_XDECREF(q);
            if (pushed == 0 || call_sink(sink, trace, rec) == 0) {
                continue;
            }
            out = -1;  /* SystemExit, KeyboardInterrupt: they leave */
            break;
        }
        if (!logged) {
            break;  /* (no second pass to make) */
        }
    }
    for (int i = 0; i < SINKS_SEEN; i++) {
        Py_XDECREF(logs[i]);  /* (a pass cut by SystemExit) */
    }
    Py_DECREF(sinks);
    Py_DECREF(trace);
    return out;
}

/* close_trace after a traced call: the call's exception, if any, stays pending, unless a
 * sink raised one that leaves (SystemExit), which replaces it as one raised in a finally
 * block would. */
static void
close_trace_after_call(RecorderBase *rec)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (close_trace(rec) < 0) {
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
        return;
    }
    PyErr_Restore(type, value, tb);
}

static PyObject *
scope_enter(ScopeBase *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *stack = self->stack, *laps = self->laps, *rec = self->rec;
    Records *rs = (Records *)self->records;
    Py_ssize_t parent = -1, n;
    long long count;
    int root;
    if (stack == NULL || laps == NULL || !PyList_CheckExact(stack) || !is_records((PyObject *)rs)
            || !PyList_CheckExact(laps) || records_len(rs) >= max_records()
            || (self->stash != NULL && self->stash != Py_None)
            || !count_value(self->count, &count)
            || ((root = (n = PyList_GET_SIZE(stack)) == 0)
                && (rs->n != 0 || rec == NULL || !PyObject_TypeCheck(rec, &RecorderBaseType)
                    || ((RecorderBase *)rec)->stack != stack
                    || ((RecorderBase *)rec)->records != (PyObject *)rs))
            || (!root && (parent = int_at(stack, n - 1)) < 0)) {
        /* an overflow, an earlier scope() call waiting for its own enter (a signal
         * handler's scope landed in between), the last trace's hand-over under way, a
         * recorder whose state was replaced, a count count_of reads: the Python method */
        PyObject *a[] = {(PyObject *)self};
        return call_general(enter_general, a, 1);
    }
    /* room first: nothing below fails once the state changed but a list's append */
    if (records_reserve(rs, 2 * RECORD_FIELDS) < 0) {
        return NULL;
    }
    self->armed = 0;  /* its count is taken */
    if (root && open_trace((RecorderBase *)rec) < 0) {  /* its recorder is the current
                                                         * one until it closes */
        return NULL;
    }
    Py_ssize_t pos = records_push(rs, self->index, parent, count), lap = -1;
    if (push_pos(stack, pos) < 0) {
        return NULL;
    }
    if (self->first >= 0) {  /* it opens with its first lap, on the same clock read */
        lap = records_push(rs, self->first, pos, NO_COUNT);
        if (push_pos(stack, lap) < 0 || push_pos(laps, lap) < 0) {
            return NULL;
        }
    }
    long long t;  /* R_START, last: bookkeeping is not timed */
    if (now_ns(&t) < 0) {
        return NULL;
    }
    if (pos < records_len(rs)) {  /* (a clock of Python code, in tests, may record) */
        FIELD(rs, pos, R_START) = t;
    }
    if (lap >= 0 && lap < records_len(rs)) {
        FIELD(rs, lap, R_START) = t;
    }
    Py_INCREF(self);
    return (PyObject *)self;
}

/* The code of exception type `type` (a new reference), or NULL with an error. */
static PyObject *
code_of(PyObject *type)
{
    PyObject *name = PyObject_GetAttr(type, str_name);
    PyObject *code = name == NULL ? NULL : PyObject_CallOneArg(error_code_fn, name);
    Py_XDECREF(name);
    return code;
}

static PyObject *
scope_exit(ScopeBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *stack = self->stack, *laps = self->laps;
    Records *rs = (Records *)self->records;
    RecorderBase *rec = (RecorderBase *)self->rec;
    Py_ssize_t n, pos, lap = -1, nl, held;
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "__exit__() takes 3 arguments (exc_type, exc, tb), %zd given", nargs);
        return NULL;
    }
    if (stack == NULL || laps == NULL || !PyList_CheckExact(stack) || !is_records((PyObject *)rs)
            || !PyList_CheckExact(laps) || (n = PyList_GET_SIZE(stack)) < 1
            || rec == NULL || !PyObject_TypeCheck((PyObject *)rec, &RecorderBaseType)) {
        goto slow;  /* not entered */
    }
    pos = int_at(stack, n - 1);
    nl = PyList_GET_SIZE(laps);
    if (nl > 0 && int_at(laps, nl - 1) == pos) {  /* its running lap ends with it */
        lap = pos;
        if (n < 2 || record_phase(rs, lap) < 0) {
            goto slow;
        }
        pos = int_at(stack, n - 2);
    }
    if (record_phase(rs, pos) != self->index) {
        goto slow;  /* not on top: inner scopes left open, or not open at all */
    }
    int closes = n == (lap >= 0 ? 2 : 1);  /* the trace closes with it */
    if (closes && rec->records != (PyObject *)rs) {
        goto slow;
    }
    held = rs->n;
    long long serial = rec->serial;
    long long t;  /* read once the case is known: the Python method reads its own */
    if (now_ns(&t) < 0) {
        return NULL;
    }
    PyObject *code = NULL;
    if (args[0] != Py_None && (code = code_of(args[0])) == NULL) {
        return NULL;
    }
    /* the clock and the error code may run Python code (a signal handler that records):
     * all is as it was, or the Python method takes the case as it is now */
    if (PyList_GET_SIZE(stack) != n || int_at(stack, n - 1) != (lap >= 0 ? lap : pos)
            || rs->n != held || rec->serial != serial
            || (lap >= 0 && PyList_GET_SIZE(laps) != nl)) {
        Py_XDECREF(code);
        goto slow;
    }
    long long c = code_value(code);
    Py_XDECREF(code);
    FIELD(rs, pos, R_END) = t;
    if (c) {
        FIELD(rs, pos, R_ERROR) = c;
    }
    if (lap >= 0) {
        FIELD(rs, lap, R_END) = t;
        if (c) {
            FIELD(rs, lap, R_ERROR) = c;
        }
    }
    list_drop(stack, lap >= 0 ? 2 : 1);
    if (lap >= 0) {
        list_drop(laps, 1);
    }
    self->pos = pos;
    if (closes && close_trace(rec) < 0) {
        return NULL;
    }
    Py_RETURN_NONE;
slow:;
    PyObject *a[] = {(PyObject *)self, args[0], args[1], args[2]};
    return call_general(exit_general, a, 4);
}

/* The scope object of `phase` (a Phase or a span name) on rec, borrowed, or NULL with no
 * error: the Python method resolves it (an unknown name, a phase registered later). Once
 * per phase: scope_for remembers it. */
COLD static PyObject *
scope_lookup(RecorderBase *rec, PyObject *phase)
{
    PyObject *s;
    if (PyUnicode_CheckExact(phase)) {
        s = PyDict_GetItemWithError(rec->named, phase);
        if (s == NULL) {
            PyErr_Clear();
            return NULL;
        }
    }
    else {
        PyObject *i = PyObject_GetAttr(phase, str_index);
        if (i == NULL) {
            PyErr_Clear();
            return NULL;
        }
        Py_ssize_t k = PyLong_CheckExact(i) ? PyLong_AsSsize_t(i) : -1;
        Py_DECREF(i);
        if (k == -1 && PyErr_Occurred()) {
            PyErr_Clear();
        }
        if (k < 0 || k >= PyList_GET_SIZE(rec->scopes)) {
            return NULL;
        }
        s = PyList_GET_ITEM(rec->scopes, k);
    }
    return PyObject_TypeCheck(s, &ScopeBaseType) ? s : NULL;
}

/* The scope of a phase object or span name, borrowed, or NULL (the Python method then
 * decides): remembered by the phase's identity. */
static inline PyObject *
scope_for(RecorderBase *rec, PyObject *phase)
{
    size_t h = (((uintptr_t)phase >> 4) ^ ((uintptr_t)phase >> 10)) & (SCOPE_SEEN - 1);
    if (rec->seen[h].phase == phase) {
        return rec->seen[h].scope;
    }
    PyObject *s = scope_lookup(rec, phase);
    if (s != NULL) {
        PyObject *was_phase = rec->seen[h].phase, *was_scope = rec->seen[h].scope;
        rec->seen[h].phase = Py_NewRef(phase);
        rec->seen[h].scope = Py_NewRef(s);
        Py_XDECREF(was_phase);  /* (after the entry is whole: a phase's or scope's
                                 * dealloc runs no code of ours) */
        Py_XDECREF(was_scope);
    }
    return s;
}

/* A count a record holds as given: an int in [-1, 2**63). */
static inline int
plain_count(PyObject *c)
{
    long long x;
    return count_value(c, &x);
}

static PyObject *scope_lap_positional(ScopeBase *self, PyObject *const *args,
                                      Py_ssize_t nargs);

/* lap(phase, count=-1): a keyword goes to the Python method as given. */
static PyObject *
scope_lap(ScopeBase *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (kwnames == NULL || PyTuple_GET_SIZE(kwnames) == 0) {
        return scope_lap_positional(self, args, nargs);
    }
    Py_ssize_t total = nargs + PyTuple_GET_SIZE(kwnames);
    if (total > 2) {
        return PyErr_Format(PyExc_TypeError, "lap() takes a phase and an optional count");
    }
    PyObject *a[3] = {(PyObject *)self, NULL, NULL};
    for (Py_ssize_t i = 0; i < total; i++) {
        a[i + 1] = args[i];
    }
    if (lap_general == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "resettrace._fast: setup_recorder() not called");
        return NULL;
    }
    return PyObject_Vectorcall(lap_general, a, nargs + 1, kwnames);
}

static PyObject *
scope_lap_positional(ScopeBase *self, PyObject *const *args, Py_ssize_t nargs)
{
    PyObject *stack = self->stack, *laps = self->laps;
    Records *rs = (Records *)self->records;
    PyObject *rec = self->rec;
    Py_ssize_t index = -1, n, nl, pos, owner;
    long long count = NO_COUNT;
    int running;
    if (nargs < 1 || nargs > 2 || (nargs == 2 && !count_value(args[1], &count))
            || rec == NULL || !PyObject_TypeCheck(rec, &RecorderBaseType)
            || stack == NULL || laps == NULL || !PyList_CheckExact(stack)
            || !is_records((PyObject *)rs) || !PyList_CheckExact(laps)) {
        goto slow;
    }
    if (args[0] != Py_None) {
        PyObject *s = scope_for((RecorderBase *)rec, args[0]);
        if (s == NULL) {
            goto slow;
        }
        index = ((ScopeBase *)s)->index;
    }
    if ((n = PyList_GET_SIZE(stack)) == 0) {
        goto slow;
    }
    pos = int_at(stack, n - 1);
    nl = PyList_GET_SIZE(laps);
    running = nl > 0 && int_at(laps, nl - 1) == pos;
    if (pos < 0 || pos >= records_len(rs)) {
        goto slow;
    }
    owner = running ? (Py_ssize_t)FIELD(rs, pos, R_PARENT) : pos;
    if (record_phase(rs, owner) != self->index
            || (index >= 0 && records_len(rs) >= max_records())) {
        goto slow;  /* not the innermost (said once), or an overflow */
    }
    if (index >= 0 && records_reserve(rs, RECORD_FIELDS) < 0) {
        return NULL;
    }
    Py_ssize_t held = rs->n;
    long long t;
    if (now_ns(&t) < 0) {
        return NULL;
    }
    if (PyList_GET_SIZE(stack) != n || PyList_GET_SIZE(laps) != nl || rs->n != held) {
        goto slow;  /* a replaced clock ran Python code that recorded */
    }
    if (running) {
        FIELD(rs, pos, R_END) = t;
        list_drop(stack, 1);
        list_drop(laps, 1);
    }
    if (index >= 0) {
        Py_ssize_t at = records_push(rs, index, owner, count);
        FIELD(rs, at, R_START) = t;
        if (push_pos(stack, at) < 0 || push_pos(laps, at) < 0) {
            return NULL;
        }
    }
    Py_RETURN_NONE;
slow:
    if (nargs < 1 || nargs > 2) {
        PyErr_Format(PyExc_TypeError, "lap() takes a phase and an optional count, %zd "
                     "arguments given", nargs);
        return NULL;
    }
    PyObject *a[] = {(PyObject *)self, args[0], nargs == 2 ? args[1] : no_count};
    return call_general(lap_general, a, 3);
}

/* The int64 fields of a trace's records: the open one (a Records) or a finished one (a
 * Trace), read afresh at each use (Python code run meanwhile may have grown the
 * buffer); *n the records. */
static inline const int64_t *
fields_of(PyObject *trace, Py_ssize_t *n)
{
    if (is_records(trace)) {
        *n = records_len((Records *)trace);
        return ((Records *)trace)->v;
    }
    *n = trace_len((Trace *)trace);
    return ((Trace *)trace)->v;
}

/* Grows whenever a phase is registered in any catalog (catalog_changed(), called by
 * resettrace.catalog): a layout made at this epoch is current, with no look at the
 * recorder's catalog (two attribute reads, ~3 us of a cold reset). */
static long long catalog_epoch = 0;

static PyObject *
fast_catalog_changed(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    catalog_epoch++;
    Py_RETURN_NONE;
}

static PyObject *
fast_catalog_epoch(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(catalog_epoch);
}

/* Scope.timing(): the closed timing dict of this scope's last run, from its layout (set
 * by the Python method on first use, with the catalog epoch it was made at): its
 * children's keys and its gap. Anything else (no layout yet, a phase registered since,
 * a scope() call waiting for its enter): the Python method. */
static PyObject *
scope_timing(ScopeBase *self, PyObject *Py_UNUSED(ignored))
{
    PyObject *layout = self->layout, *rec = self->rec, *out = NULL;
    if (self->armed || layout == NULL || !PyTuple_CheckExact(layout)
            || PyTuple_GET_SIZE(layout) != 5 || rec == NULL
            || !PyObject_TypeCheck(rec, &RecorderBaseType)
            || !PyLong_CheckExact(PyTuple_GET_ITEM(layout, 4))) {
        goto general;
    }
    /* made at this catalog epoch: no phase registered since */
    int same = PyLong_AsLongLong(PyTuple_GET_ITEM(layout, 4)) == catalog_epoch;
    PyObject *key_of = PyTuple_GET_ITEM(layout, 1), *zeros = PyTuple_GET_ITEM(layout, 2);
    PyObject *gap_key = PyTuple_GET_ITEM(layout, 3);
    if (same != 1 || !PyDict_CheckExact(key_of) || !PyDict_CheckExact(zeros)) {
        PyErr_Clear();
        goto general;
    }
    RecorderBase *rb = (RecorderBase *)rec;
    PyObject *trace = PyList_GET_SIZE(rb->stack) > 0 ? rb->records : rb->last;
    if (!is_records(trace) && !Py_IS_TYPE(trace, &TraceType)) {
        goto general;
    }
    Py_INCREF(trace);
    out = PyDict_Copy(zeros);  /* (may run a collection: the fields are read after it) */
    if (out == NULL) {
        Py_DECREF(trace);
        return NULL;
    }
    Py_ssize_t pos = self->pos, n;
    const int64_t *v = fields_of(trace, &n);
    if (pos < 0 || pos >= n || v[pos * RECORD_FIELDS + R_PHASE] != self->index) {
        Py_DECREF(trace);
        return out;  /* never run */
    }
    long long total = 0;
    for (Py_ssize_t j = pos + 1; j < n; j++) {
        v = fields_of(trace, &n);  /* afresh: a value made below may run a collection */
        if (j >= n) {
            break;
        }
        const int64_t *r = v + j * RECORD_FIELDS;
        if (r[R_PARENT] != pos) {
            continue;  /* not a direct child */
        }
        long long d = r[R_END] - r[R_START];
        PyObject *phase = PyLong_FromLongLong(r[R_PHASE]);
        PyObject *key = phase ? PyDict_GetItemWithError(key_of, phase) : NULL;
        Py_XDECREF(phase);
        if (key == NULL) {
            if (PyErr_Occurred()) {
                goto fail;
            }
            continue;  /* a child of no key of its own */
        }
        total += d;
        PyObject *was = PyDict_GetItemWithError(out, key);
        double x = was && PyFloat_CheckExact(was) ? PyFloat_AS_DOUBLE(was) : 0.0;
        PyObject *now = PyFloat_FromDouble(x + d * 1e-6);
        if (now == NULL || PyDict_SetItem(out, key, now) < 0) {
            Py_XDECREF(now);
            goto fail;
        }
        Py_DECREF(now);
    }
    v = fields_of(trace, &n);
    if (gap_key != Py_None && pos < n) {
        long long own = v[pos * RECORD_FIELDS + R_END] - v[pos * RECORD_FIELDS + R_START];
        PyObject *gap = PyFloat_FromDouble((own - total) * 1e-6);
        if (gap == NULL || PyDict_SetItem(out, gap_key, gap) < 0) {
            Py_XDECREF(gap);
            goto fail;
        }
        Py_DECREF(gap);
    }
    Py_DECREF(trace);
    return out;
fail:
    Py_DECREF(trace);
    Py_DECREF(out);
    return NULL;
general:;
    PyObject *a[] = {(PyObject *)self};
    return call_general(timing_general, a, 1);
}

static PyMethodDef scope_methods[] = {
    {"__enter__", (PyCFunction)scope_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))scope_exit, METH_FASTCALL, NULL},
    {"lap", (PyCFunction)(void (*)(void))scope_lap, METH_FASTCALL | METH_KEYWORDS,
     "lap(phase, count=-1): see recorder.Scope.lap."},
    {"timing", (PyCFunction)scope_timing, METH_NOARGS,
     "timing(): see recorder.Scope.timing."},
    {NULL},
};

static PyMemberDef scope_members[] = {
    {"_rec", T_OBJECT, offsetof(ScopeBase, rec), 0, NULL},
    {"_index", T_PYSSIZET, offsetof(ScopeBase, index), 0, NULL},
    {"_count", T_OBJECT, offsetof(ScopeBase, count), 0, NULL},
    {"_first", T_PYSSIZET, offsetof(ScopeBase, first), 0, NULL},
    {"_pos", T_PYSSIZET, offsetof(ScopeBase, pos), 0, NULL},
    {"_stack", T_OBJECT, offsetof(ScopeBase, stack), 0, NULL},
    {"_records", T_OBJECT, offsetof(ScopeBase, records), 0, NULL},
    {"_laps", T_OBJECT, offsetof(ScopeBase, laps), 0, NULL},
    {"_layout", T_OBJECT, offsetof(ScopeBase, layout), 0, NULL},
    {"_armed", T_BOOL, offsetof(ScopeBase, armed), 0, NULL},
    {"_stash", T_OBJECT, offsetof(ScopeBase, stash), 0, NULL},
    {NULL},
};

static PyTypeObject ScopeBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.ScopeBase",
    .tp_basicsize = sizeof(ScopeBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The fields of a recorder scope and its enter/exit inside an open trace.",
    .tp_traverse = (traverseproc)scope_traverse,
    .tp_clear = (inquiry)scope_clear,
    .tp_dealloc = (destructor)scope_dealloc,
    .tp_new = scope_new,
    .tp_methods = scope_methods,
    .tp_members = scope_members,
};

/* scope() in Python: Recorder._scope_general(self, *args). */
COLD static PyObject *
rb_scope_general(RecorderBase *self, PyObject *const *args, Py_ssize_t nargs,
                 PyObject *kwnames)
{
    if (scope_general == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "resettrace._fast: setup_recorder() not called");
        return NULL;
    }
    PyObject *a[4];
    Py_ssize_t total = nargs + (kwnames ? PyTuple_GET_SIZE(kwnames) : 0);
    if (total + 1 > 4) {
        return PyErr_Format(PyExc_TypeError, "scope() takes at most 3 arguments");
    }
    a[0] = (PyObject *)self;
    for (Py_ssize_t i = 0; i < total; i++) {
        a[i + 1] = args[i];
    }
    return PyObject_Vectorcall(scope_general, a, nargs + 1, kwnames);
}

/* RecorderBase.scope(phase, count=-1, lap=None): the common case of recorder.Recorder's
 * scope() (a scope inside this thread's open trace, a plain int count): the phase's scope
 * object, armed with the count and first lap for its __enter__. Every other case: the
 * Python method given by setup_recorder(), before anything changed. */
static PyObject *
rb_scope(RecorderBase *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), first = -1;
    PyObject *count = no_count, *s;
    if ((kwnames != NULL && PyTuple_GET_SIZE(kwnames)) || nargs < 1 || nargs > 3
            || self->owner != PyThread_get_thread_ident()) {
        goto general;
    }
    if (PyList_GET_SIZE(self->stack) == 0) {
        /* a scope opened here joins a trace this thread has open on another recorder */
        PyObject *cur = current_borrowed();
        int mine = cur == Py_None || cur == (PyObject *)self
            || (PyObject_TypeCheck(cur, &RecorderBaseType)
                && PyList_GET_SIZE(((RecorderBase *)cur)->stack) == 0);
        if (!mine) {
            goto general;
        }
    }
    if (nargs >= 2) {
        count = args[1];
        if (!plain_count(count)) {
            goto general;  /* count_of reads it */
        }
    }
    if (nargs == 3 && args[2] != Py_None) {
        PyObject *f = scope_for(self, args[2]);
        if (f == NULL) {
            goto general;
        }
        first = ((ScopeBase *)f)->index;
    }
    s = scope_for(self, args[0]);
    if (s == NULL || ((ScopeBase *)s)->armed) {
        goto general;  /* an earlier call's, not entered yet: kept for its __enter__ */
    }
    ScopeBase *sb = (ScopeBase *)s;
    Py_SETREF(sb->count, Py_NewRef(count));
    sb->first = first;
    sb->armed = 1;
    return Py_NewRef(s);
general:
    return rb_scope_general(self, args, nargs, kwnames);
}

static PyMethodDef rb_methods[] = {
    {"scope", (PyCFunction)(void (*)(void))rb_scope, METH_FASTCALL | METH_KEYWORDS,
     "scope(phase, count=-1, lap=None): see recorder.Recorder.scope."},
    {NULL},
};

static PyTypeObject RecorderBaseType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.RecorderBase",
    .tp_basicsize = sizeof(RecorderBase),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .tp_doc = "The state of a recorder that the hot path reads (see recorder.Recorder).",
    .tp_traverse = (traverseproc)rb_traverse,
    .tp_clear = (inquiry)rb_clear,
    .tp_dealloc = (destructor)rb_dealloc,
    .tp_new = rb_new,
    .tp_methods = rb_methods,
    .tp_getset = rb_getset,
    .tp_members = rb_members,
};

/* A recorder's lists and owner: the slots of recorder.Recorder (offsets read from its
 * member descriptors by setup_api), read where the recorder holds them now, so code that
 * replaces a list is followed and nothing is kept alive. */
typedef struct {
    PyObject *stack, *records, *scopes;  /* new references */
    int mine;                             /* its owner is this thread */
} Parts;

static PyObject *recorder_type;   /* recorder.Recorder (set by setup_api) */

/* 0, or -1 (no error set) when rec is not a recorder.Recorder (a subclass may route
 * otherwise: Python takes it). */
static int
rec_parts(PyObject *rec, Parts *parts)
{
    if ((PyObject *)Py_TYPE(rec) != recorder_type
            || !PyObject_TypeCheck(rec, &RecorderBaseType)) {
        return -1;
    }
    RecorderBase *rb = (RecorderBase *)rec;
    if (!is_records(rb->records)) {
        return -1;
    }
    parts->stack = Py_NewRef(rb->stack);
    parts->records = Py_NewRef(rb->records);
    parts->scopes = Py_NewRef(rb->scopes);
    parts->mine = rb->owner == PyThread_get_thread_ident();
    return 0;
}

/* rec_parts into separate new references (NULL on -1). */
static int
rec_take(PyObject *rec, PyObject **stack, PyObject **records, PyObject **scopes, int *mine)
{
    Parts parts;
    if (rec_parts(rec, &parts) < 0) {
        return -1;
    }
    *stack = parts.stack;
    *records = parts.records;
    *scopes = parts.scopes;
    *mine = parts.mine;
    return 0;
}


/* ---------------------------------------------------------------- Traced */
/* The core of a traced() wrapper (api.py): ``run(args, kwargs)``, called by the wrapper
 * function with its arguments. Kinds:
 * KIND_CALL (Recorder.call), KIND_LEAF (Recorder.call_leaf), KIND_CHAIN
 * (Recorder.call_chain), each the common case of that method. */
enum { KIND_CALL = 0, KIND_LEAF = 1, KIND_CHAIN = 2 };

static PyObject *env_count_key;   /* catalog.ATTR_ENV_COUNT */
static PyObject *adopt_general;   /* Recorder._adopt(rec, pos, parent, index, serial) */
static PyObject *str_attributes, *str_exit, *str_call, *str_call_leaf;

/* The thread's default recorder, as api.py resolved it (the default session's recorder
 * of this thread), for a traced call that no open trace or bound recorder takes: a weak
 * reference to it, or None (tracing off: the call runs untraced), valid while
 * default_epoch is the one it was resolved at. api.py moves the epoch on whenever the
 * default session changes (made, replaced, shut down; a fork) and tells the thread's
 * resolution with remember_default(); until then the Python path resolves it. */
static long long default_epoch = 1;
static _Thread_local long long tls_default_epoch = 0;
static _Thread_local PyObject *tls_default = NULL;  /* a weakref, or None; owned */

typedef struct {
    PyObject_HEAD
    int kind;
    PyObject *fn;
    PyObject *general;    /* general(args, kwargs): every case */
    PyObject *count_now;  /* count_now(args, kwargs) -> the count, when not static */
    PyObject *statik;     /* the count of every call, or NULL */
    Py_ssize_t count_at;  /* the positional argument the count is read from (-1: none) */
    PyObject *count_path; /* attribute names read from it (a tuple) */
    Py_ssize_t index;     /* the phase (call, leaf) */
    Py_ssize_t within;    /* the phase it is recorded inside, or -1 */
    int envs;             /* it sets the recorder's env count on its first call */
    PyObject *chains;     /* chain: innermost open phase -> the levels to open (a dict) */
    PyObject *known;      /* chain: innermost open phase -> (levels, highest level) */
    vectorcallfunc vectorcall;
} Traced;

static int
traced_traverse(Traced *self, visitproc visit, void *arg)
{
    Py_VISIT(self->fn);
    Py_VISIT(self->general);
    Py_VISIT(self->count_now);
    Py_VISIT(self->statik);
    Py_VISIT(self->count_path);
    Py_VISIT(self->chains);
    Py_VISIT(self->known);
    return 0;
}

static int
traced_clear(Traced *self)
{
    Py_CLEAR(self->fn);
    Py_CLEAR(self->general);
    Py_CLEAR(self->count_now);
    Py_CLEAR(self->statik);
    Py_CLEAR(self->count_path);
    Py_CLEAR(self->chains);
    Py_CLEAR(self->known);
    return 0;
}

static void
traced_dealloc(Traced *self)
{
    PyObject_GC_UnTrack(self);
    traced_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* The error code of the pending exception's type (the exception stays pending), or NULL
 * when none is pending. A failure to get it leaves the code out. */
static PyObject *
pending_code(PyObject **exc_type)
{
    PyObject *type, *value, *tb;
    *exc_type = NULL;
    if (!PyErr_Occurred()) {
        return NULL;
    }
    PyErr_Fetch(&type, &value, &tb);
    PyObject *name = PyObject_GetAttr(type, str_name);
    PyObject *code = name ? PyObject_CallOneArg(error_code_fn, name) : NULL;
    Py_XDECREF(name);
    if (code == NULL) {
        PyErr_Clear();
    }
    *exc_type = type;  /* borrowed: restored below by the caller's PyErr_Restore */
    PyErr_Restore(type, value, tb);
    return code;
}

/* Call fn(*args) for its effect, with the exception of the traced call, if any, kept
 * pending; an error of the call itself is reported as unraisable (call_keeping_error). */
COLD static void
call_function_keeping_error(PyObject *fn, PyObject *const *args, size_t n)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_Vectorcall(fn, (PyObject **)args, n, NULL);
    if (r == NULL) {
        PyErr_WriteUnraisable(fn);
    }
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

/* Call method `name` (args[0] is the object) for its effect, with the exception of the
 * traced call, if any, kept pending; an error of the call itself is reported as
 * unraisable: recording never raises into the user's call, nor replaces its exception. */
static void
call_keeping_error(PyObject *callable, PyObject *name, PyObject *const *args, size_t n)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *r = PyObject_VectorcallMethod(name, (PyObject **)args, n, NULL);
    if (r == NULL) {
        PyErr_WriteUnraisable(callable);
    }
    Py_XDECREF(r);
    PyErr_Restore(type, value, tb);
}

/* recorder.count_of for the common values, else NULL (no error): an int in [0, 2**63) as
 * is; a numpy
 * array of bools, 1-D: its True values; another numpy array of 1 or more dimensions: its
 * len(). */
static PyObject *
count_fast(PyObject *v)
{
    if (PyLong_CheckExact(v)) {  /* the count itself, in [0, 2**63); else count_of says */
        int overflow;
        long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
        if (x == -1 && PyErr_Occurred()) {
            PyErr_Clear();
            return NULL;
        }
        return overflow == 0 && x >= 0 ? Py_NewRef(v) : NULL;
    }
    if (strcmp(Py_TYPE(v)->tp_name, "numpy.ndarray") != 0) {
        return NULL;
    }
    Py_buffer b;
    if (PyObject_GetBuffer(v, &b, PyBUF_RECORDS_RO) < 0) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *out = NULL;
    if (b.ndim >= 1 && b.shape != NULL) {
        if (b.format != NULL && strcmp(b.format, "?") == 0) {
            if (b.ndim == 1 && b.itemsize == 1 && b.strides != NULL) {
                const unsigned char *p = (const unsigned char *)b.buf;
                Py_ssize_t k = 0, i = 0, n = b.shape[0], st = b.strides[0];
                if (st == 1) {  /* contiguous: 8 bytes at a time, a bit per nonzero byte */
                    for (; i + 8 <= n; i += 8) {
                        uint64_t w;
                        memcpy(&w, p + i, 8);
                        w |= w >> 4;
                        w |= w >> 2;
                        w |= w >> 1;
                        k += __builtin_popcountll(w & 0x0101010101010101ULL);
                    }
                }
                for (; i < n; i++) {
                    k += p[i * st] != 0;
                }
                out = PyLong_FromSsize_t(k);
            }
        }
        else {
            out = PyLong_FromSsize_t(b.shape[0]);
        }
    }
    PyBuffer_Release(&b);
    return out;
}

static PyObject *
to_python(Traced *self, PyObject *args, PyObject *kwargs)
{
    return PyObject_CallFunctionObjArgs(self->general, args, kwargs, NULL);
}

static PyObject *
count_of_call(Traced *self, PyObject *args, PyObject *kwargs)
{
    if (self->statik != NULL) {
        return Py_NewRef(self->statik);
    }
    if (self->count_at >= 0 && self->count_at < PyTuple_GET_SIZE(args)) {
        PyObject *v = Py_NewRef(PyTuple_GET_ITEM(args, self->count_at));
        for (Py_ssize_t k = 0; v != NULL && k < PyTuple_GET_SIZE(self->count_path); k++) {
            Py_SETREF(v, PyObject_GetAttr(v, PyTuple_GET_ITEM(self->count_path, k)));
        }
        PyObject *c = v == NULL ? NULL : count_fast(v);
        Py_XDECREF(v);
        if (c != NULL) {
            return c;
        }
        PyErr_Clear();
    }
    /* anything else (a keyword argument, a callable, a value count_fast does not know, a
     * failure, which it logs once): the Python reader */
    return PyObject_CallFunctionObjArgs(self->count_now, args, kwargs, NULL);
}

/* rec.<method>(phase, count, fn, args, kwargs) (Recorder.call, call_leaf), with the count
 * already read: what a traced call does when the count's reader changed the recorder's
 * stack or records (it ran Python code: a property, a __len__, a signal handler that
 * records), so that nothing read before is used, and the count is not read twice. */
static PyObject *
call_counted(PyObject *rec, PyObject *method, Py_ssize_t index, PyObject *c, PyObject *fn,
             PyObject *args, PyObject *kwargs)
{
    PyObject *catalog = PyObject_GetAttr(rec, str_catalog);
    if (catalog == NULL) {
        return NULL;
    }
    PyObject *phase = PySequence_GetItem(catalog, index);
    Py_DECREF(catalog);
    if (phase == NULL) {
        return NULL;
    }
    PyObject *result = PyObject_CallMethodObjArgs(rec, method, phase, c, fn, args, kwargs,
                                                  NULL);
    Py_DECREF(phase);
    return result;
}

/* Whether the stack and records are as they were (n entries, top the object `top`, which
 * the caller holds, or NULL when empty; `held` int64s; no trace closed since `serial`)
 * before Python code ran. */
static inline int
unchanged(PyObject *stack, Records *rs, RecorderBase *rb, Py_ssize_t n, PyObject *top,
          Py_ssize_t held, long long serial)
{
    return PyList_GET_SIZE(stack) == n && rs->n == held && rb->serial == serial
        && (n == 0 || PyList_GET_ITEM(stack, n - 1) == top);
}

static inline PyObject *
call_fn(Traced *self, PyObject *args, PyObject *kwargs)
{
    return PyObject_Call(self->fn, args, PyDict_GET_SIZE(kwargs) ? kwargs : NULL);
}

/* Whether phase `within` is open below the top of the stack. */
static int
open_below(PyObject *stack, Records *rs, Py_ssize_t within)
{
    Py_ssize_t n = PyList_GET_SIZE(stack);
    for (Py_ssize_t k = 0; k < n; k++) {
        if (record_phase(rs, int_at(stack, k)) == within) {
            return 1;
        }
    }
    return 0;
}

static PyObject *
run_call(Traced *self, PyObject *args, PyObject *kwargs)
{
    PyObject *rec = Py_NewRef(current_borrowed());
    if (rec == NULL) {
        return NULL;
    }
    PyObject *stack = NULL, *records = NULL, *scopes = NULL, *c = NULL;
    PyObject *result = NULL, *top = NULL, *s = NULL;
    int root = 0, mine = 0;
    if (rec == Py_None) {  /* none open, none bound */
        Py_DECREF(rec);
        if (self->within >= 0) {
            return call_fn(self, args, kwargs);  /* not on the path it is recorded on */
        }
        if (tls_default == NULL || tls_default_epoch != default_epoch) {
            return to_python(self, args, kwargs);  /* resolved there, remembered */
        }
        if (tls_default == Py_None) {
            return call_fn(self, args, kwargs);  /* tracing off */
        }
        rec = PyWeakref_GetObject(tls_default);  /* borrowed */
        if (rec == NULL || rec == Py_None) {
            PyErr_Clear();
            return to_python(self, args, kwargs);
        }
        Py_INCREF(rec);
        if ((PyObject *)Py_TYPE(rec) != recorder_type
                || rec_take(rec, &stack, &records, &scopes, &mine) < 0 || PyList_GET_SIZE(stack) != 0
                || ((Records *)records)->n != 0) {  /* (a hand-over under way: Python) */
            PyErr_Clear();
            goto to_general;
        }
        root = 1;
    }
    else {
        if ((PyObject *)Py_TYPE(rec) != recorder_type || rec_take(rec, &stack, &records, &scopes, &mine) < 0
                || PyList_GET_SIZE(stack) == 0 || !mine) {
            goto to_general;
        }
    }
    Py_ssize_t n = PyList_GET_SIZE(stack);
    Records *rs = (Records *)records;
    RecorderBase *rb = (RecorderBase *)rec;
    if (self->within >= 0 && record_phase(rs, int_at(stack, n - 1)) != self->within) {
        if (open_below(stack, rs, self->within)) {
            goto to_general;
        }
        Py_DECREF(rec);
        Py_DECREF(stack);
        Py_DECREF(records);
        Py_DECREF(scopes);
        return call_fn(self, args, kwargs);  /* not on the path it is recorded on */
    }
    Py_ssize_t parent = root ? -1 : int_at(stack, n - 1);
    if (records_len(rs) >= max_records() || self->index >= PyList_GET_SIZE(scopes)
            || parent < -1) {
        goto to_general;
    }
    s = Py_NewRef(PyList_GET_ITEM(scopes, self->index));
    if (!PyObject_TypeCheck(s, &ScopeBaseType)) {
        goto to_general;
    }
    if (self->envs) {
        PyObject *attrs = PyObject_GetAttr(rec, str_attributes);
        int has = attrs && PyDict_Check(attrs) ? PyDict_Contains(attrs, env_count_key) : -1;
        Py_XDECREF(attrs);
        if (has != 1) {
            PyErr_Clear();
            goto to_general;  /* it sets the env count first */
        }
    }
    top = n > 0 ? Py_NewRef(PyList_GET_ITEM(stack, n - 1)) : NULL;
    Py_ssize_t held = rs->n;
    long long serial = rb->serial, count;
    c = count_of_call(self, args, kwargs);
    if (c == NULL) {
        goto done;
    }
    if (!unchanged(stack, rs, rb, n, top, held, serial) || !count_value(c, &count)) {
        /* the count's reader recorded: nothing read before is used, the count not read
         * again */
        result = call_counted(rec, str_call, self->index, c, self->fn, args, kwargs);
        goto done;
    }
    if (records_reserve(rs, RECORD_FIELDS) < 0) {
        goto done;
    }
    if (root && open_trace(rb) < 0) {  /* its recorder is the current one until it closes */
        goto done;
    }
    Py_ssize_t pos = records_push(rs, self->index, parent, count);
    if (push_pos(stack, pos) < 0) {
        goto done;
    }
    long long t;
    if (now_ns(&t) < 0) {
        goto done;
    }
    if (pos < records_len(rs)) {
        FIELD(rs, pos, R_START) = t;  /* R_START, last */
    }
    result = call_fn(self, args, kwargs);
    now_after(&t);
    PyObject *exc_type;
    PyObject *code = pending_code(&exc_type);
    Py_ssize_t m = PyList_GET_SIZE(stack);
    if (m > 0 && int_at(stack, m - 1) == pos && rb->serial == serial
            && pos < records_len(rs)) {
        FIELD(rs, pos, R_END) = t;
        long long e = code_value(code);
        if (e) {
            FIELD(rs, pos, R_ERROR) = e;
        }
        list_drop(stack, 1);
        ((ScopeBase *)s)->pos = pos;  /* it remembers the run: its timing(), its count */
        if (!((ScopeBase *)s)->armed) {  /* (else a scope() waits for its enter) */
            Py_XSETREF(((ScopeBase *)s)->count, Py_NewRef(c));
        }
        if (m == 1) {
            close_trace_after_call(rb);
            if (result != NULL && PyErr_Occurred()) {
                Py_CLEAR(result);  /* a sink's SystemExit leaves */
            }
        }
    }
    else {  /* not on top: it exits as a ``with`` scope's would */
        PyObject *a[] = {s, exc_type ? exc_type : Py_None, Py_None, Py_None};
        call_keeping_error(s, str_exit, a, 4);
    }
    Py_XDECREF(code);
    if (result == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_SystemError, "resettrace: a traced call failed without an error");
    }
    goto done;
to_general:
    result = to_python(self, args, kwargs);
done:
    Py_XDECREF(rec);
    Py_XDECREF(stack);
    Py_XDECREF(records);
    Py_XDECREF(scopes);
    Py_XDECREF(c);
    Py_XDECREF(top);
    Py_XDECREF(s);
    return result;
}

static PyObject *
run_leaf(Traced *self, PyObject *args, PyObject *kwargs)
{
    PyObject *rec = Py_NewRef(current_borrowed());
    if (rec == NULL) {
        return NULL;
    }
    if (rec == Py_None) {
        Py_DECREF(rec);
        return call_fn(self, args, kwargs);  /* no trace open: not on its path */
    }
    PyObject *stack = NULL, *records = NULL, *scopes = NULL, *c = NULL, *result = NULL;
    PyObject *top = NULL;
    int mine = 0;
    if ((PyObject *)Py_TYPE(rec) != recorder_type
            || rec_take(rec, &stack, &records, &scopes, &mine) < 0
            || PyList_GET_SIZE(stack) == 0 || !mine) {
        goto to_general;
    }
    Records *rs = (Records *)records;
    RecorderBase *rb = (RecorderBase *)rec;
    Py_ssize_t n = PyList_GET_SIZE(stack);
    Py_ssize_t at = int_at(stack, n - 1);
    if (record_phase(rs, at) != self->within || records_len(rs) >= max_records()) {
        goto to_general;
    }
    top = Py_NewRef(PyList_GET_ITEM(stack, n - 1));  /* the count's reader may run code */
    Py_ssize_t held = rs->n;
    long long serial = rb->serial, count;
    c = count_of_call(self, args, kwargs);
    if (c == NULL) {
        goto done;
    }
    if (!unchanged(stack, rs, rb, n, top, held, serial) || !count_value(c, &count)) {
        result = call_counted(rec, str_call_leaf, self->index, c, self->fn, args, kwargs);
        goto done;
    }
    if (records_reserve(rs, RECORD_FIELDS) < 0) {
        goto done;
    }
    Py_ssize_t pos = records_push(rs, self->index, at, count);
    long long t;
    if (now_ns(&t) < 0) {
        goto done;
    }
    if (pos < records_len(rs)) {
        FIELD(rs, pos, R_START) = t;
    }
    result = call_fn(self, args, kwargs);
    now_after(&t);
    PyObject *exc_type;
    PyObject *code = pending_code(&exc_type);
    int same = rb->serial == serial && pos < records_len(rs);
    if (same) {
        FIELD(rs, pos, R_END) = t;
        long long e = code_value(code);
        if (e) {
            FIELD(rs, pos, R_ERROR) = e;
        }
    }
    Py_XDECREF(code);
    if (!same || records_len(rs) != pos + 1) {
        /* scopes opened inside it (its children), or its trace was cut meanwhile */
        PyObject *ppos = PyLong_FromSsize_t(pos);
        PyObject *pat = PyLong_FromSsize_t(at);
        PyObject *idx = PyLong_FromSsize_t(self->index);
        PyObject *ser = PyLong_FromLongLong(serial);
        if (ppos && pat && idx && ser && adopt_general != NULL) {
            PyObject *a[] = {rec, ppos, pat, idx, ser};
            call_function_keeping_error(adopt_general, a, 5);
        }
        Py_XDECREF(ppos);
        Py_XDECREF(pat);
        Py_XDECREF(idx);
        Py_XDECREF(ser);
    }
    goto done;
to_general:
    result = to_python(self, args, kwargs);
done:
    Py_XDECREF(rec);
    Py_XDECREF(stack);
    Py_XDECREF(records);
    Py_XDECREF(scopes);
    Py_XDECREF(c);
    Py_XDECREF(top);
    return result;
}

static PyObject *
run_chain(Traced *self, PyObject *args, PyObject *kwargs)
{
    PyObject *rec = Py_NewRef(current_borrowed());
    if (rec == NULL) {
        return NULL;
    }
    PyObject *stack = NULL, *records = NULL, *scopes = NULL, *c = NULL, *result = NULL;
    PyObject *held = NULL, *chain_held = NULL, *key = NULL;
    int mine = 0;
    if (rec == Py_None || (PyObject *)Py_TYPE(rec) != recorder_type
            || rec_take(rec, &stack, &records, &scopes, &mine) < 0
            || PyList_GET_SIZE(stack) == 0 || !mine) {
        goto to_general;
    }
    Records *rs = (Records *)records;
    RecorderBase *rb = (RecorderBase *)rec;
    Py_ssize_t n0 = PyList_GET_SIZE(stack);
    PyObject *parent = PyList_GET_ITEM(stack, n0 - 1);
    Py_ssize_t at = int_at(stack, n0 - 1);
    Py_ssize_t phase = record_phase(rs, at);
    if (phase < 0) {
        goto to_general;
    }
    key = PyLong_FromSsize_t(phase);
    if (key == NULL) {
        goto done;
    }
    PyObject *known = PyDict_GetItemWithError(self->known, key);  /* borrowed */
    if (known == NULL) {
        if (PyErr_Occurred()) {
            goto done;
        }
        PyObject *chain = PyDict_GetItemWithError(self->chains, key);
        if (chain == NULL || !PyTuple_CheckExact(chain) || PyTuple_GET_SIZE(chain) == 0) {
            PyErr_Clear();
            goto to_general;  /* it works the chain out */
        }
        Py_ssize_t top = -1;
        for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(chain); k++) {
            Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(chain, k));
            if (v == -1 && PyErr_Occurred()) {
                PyErr_Clear();
                goto to_general;
            }
            top = v > top ? v : top;
        }
        PyObject *t = Py_BuildValue("(On)", chain, top);
        if (t == NULL || PyDict_SetItem(self->known, key, t) < 0) {
            Py_XDECREF(t);
            goto done;
        }
        Py_DECREF(t);
        known = t;  /* held by the dict */
    }
    PyObject *chain = PyTuple_GET_ITEM(known, 0);
    Py_ssize_t top = PyLong_AsSsize_t(PyTuple_GET_ITEM(known, 1));
    Py_ssize_t n = PyTuple_GET_SIZE(chain);
    Py_ssize_t base = records_len(rs);
    if (base + n > max_records() || top >= PyList_GET_SIZE(scopes)) {
        goto to_general;
    }
    Py_ssize_t idx[4];
    for (int k = 0; n == 4 && k < 4; k++) {
        idx[k] = PyLong_AsSsize_t(PyTuple_GET_ITEM(chain, k));
        if (idx[k] < 0 || idx[k] >= PyList_GET_SIZE(scopes)
                || !PyObject_TypeCheck(PyList_GET_ITEM(scopes, idx[k]), &ScopeBaseType)) {
            goto to_general;
        }
    }
    parent = held = Py_NewRef(parent);  /* the count's reader may run Python code */
    Py_INCREF(chain);
    chain_held = chain;
    Py_ssize_t fields = rs->n;
    long long serial = rb->serial, count;
    c = count_of_call(self, args, kwargs);
    if (c == NULL) {
        goto done;
    }
    if (n != 4 || !unchanged(stack, rs, rb, n0, parent, fields, serial)
            || !count_value(c, &count)) {
        /* other lengths, or a count's reader that recorded: as the Python path takes it */
        result = PyObject_CallMethod(rec, "call_chain", "OOOOO", chain, c, self->fn, args,
                                     kwargs);
        goto done;
    }
    /* a reset under an env step (reset_done down to set_state), each under the one
     * before */
    if (records_reserve(rs, 4 * RECORD_FIELDS) < 0) {
        goto done;
    }
    for (int k = 0; k < 4; k++) {
        records_push(rs, idx[k], k == 0 ? at : base + k - 1, count);
    }
    for (int k = 0; k < 4; k++) {
        if (push_pos(stack, base + k) < 0) {
            goto done;
        }
    }
    long long t;
    if (now_ns(&t) < 0) {
        goto done;
    }
    for (int k = 0; k < 4 && base + k < records_len(rs); k++) {
        FIELD(rs, base + k, R_START) = t;
    }
    result = call_fn(self, args, kwargs);
    now_after(&t);
    PyObject *exc_type;
    PyObject *code = pending_code(&exc_type);
    Py_ssize_t last = base + 3;
    Py_ssize_t m = PyList_GET_SIZE(stack);
    if (m > 0 && int_at(stack, m - 1) == last && rb->serial == serial
            && last < records_len(rs)) {
        long long e = code_value(code);
        for (int k = 0; k < 4; k++) {
            FIELD(rs, base + k, R_END) = t;
            if (e) {
                FIELD(rs, base + k, R_ERROR) = e;
            }
            PyObject *sk = idx[k] < PyList_GET_SIZE(scopes)
                ? PyList_GET_ITEM(scopes, idx[k]) : NULL;
            if (sk != NULL && PyObject_TypeCheck(sk, &ScopeBaseType)) {
                ((ScopeBase *)sk)->pos = base + k;
            }
        }
        list_drop(stack, m < 4 ? m : 4);
        if (m <= 4) {
            close_trace_after_call(rb);
            if (result != NULL && PyErr_Occurred()) {
                Py_CLEAR(result);  /* a sink's SystemExit leaves */
            }
        }
    }
    else if (rb->serial == serial && records_len(rs) > last) {
        /* not on top as opened (scopes left open inside): each level exits as its scope
         * would, innermost first */
        for (Py_ssize_t q = last; q >= base; q--) {
            Py_ssize_t iq = record_phase(rs, q);
            if (iq < 0 || iq >= PyList_GET_SIZE(scopes)) {
                continue;
            }
            PyObject *sq = PyList_GET_ITEM(scopes, iq);
            PyObject *a[] = {sq, exc_type ? exc_type : Py_None, Py_None, Py_None};
            call_keeping_error(sq, str_exit, a, 4);
        }
    }
    Py_XDECREF(code);
    goto done;
to_general:
    PyErr_Clear();
    result = to_python(self, args, kwargs);
done:
    Py_XDECREF(rec);
    Py_XDECREF(stack);
    Py_XDECREF(records);
    Py_XDECREF(scopes);
    Py_XDECREF(c);
    Py_XDECREF(held);
    Py_XDECREF(chain_held);
    Py_XDECREF(key);
    return result;
}

static PyObject *
traced_vectorcall(Traced *self, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs != 2 || (kwnames && PyTuple_GET_SIZE(kwnames)) || !PyTuple_Check(args[0])
            || !PyDict_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "run(args: tuple, kwargs: dict)");
        return NULL;
    }
    PyObject *kwargs = args[1];
    switch (self->kind) {
    case KIND_LEAF:
        return run_leaf(self, args[0], kwargs);
    case KIND_CHAIN:
        return run_chain(self, args[0], kwargs);
    default:
        return run_call(self, args[0], kwargs);
    }
}


static PyObject *
traced_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"kind", "fn", "general", "count_now", "static", "index",
                             "within", "envs", "chains", "count_at", "count_path", NULL};
    int kind, envs;
    PyObject *fn, *gen, *count_now, *statik, *chains, *count_path;
    Py_ssize_t index, within, count_at;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iOOOOnnpO!nO!", kwlist, &kind, &fn, &gen,
                                     &count_now, &statik, &index, &within, &envs,
                                     &PyDict_Type, &chains, &count_at, &PyTuple_Type,
                                     &count_path)) {
        return NULL;
    }
    if (kind < KIND_CALL || kind > KIND_CHAIN) {
        PyErr_SetString(PyExc_ValueError, "kind must be 0 (call), 1 (leaf) or 2 (chain)");
        return NULL;
    }
    if (index < 0 || within < -1 || count_at < -1) {
        PyErr_Format(PyExc_ValueError, "index must be >= 0 and within, count_at >= -1 "
                     "(got index=%zd, within=%zd, count_at=%zd)", index, within, count_at);
        return NULL;
    }
    Traced *self = (Traced *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    self->kind = kind;
    self->fn = Py_NewRef(fn);
    self->general = Py_NewRef(gen);
    self->count_now = Py_NewRef(count_now);
    self->statik = statik == Py_None ? NULL : Py_NewRef(statik);
    self->count_at = count_at;
    self->count_path = Py_NewRef(count_path);
    self->index = index;
    self->within = within;
    self->envs = envs;
    self->chains = Py_NewRef(chains);
    self->known = PyDict_New();
    if (self->known == NULL) {
        Py_DECREF(self);
        return NULL;
    }
    self->vectorcall = (vectorcallfunc)traced_vectorcall;
    return (PyObject *)self;
}

static PyTypeObject TracedType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "resettrace.tracing._fast.Traced",
    .tp_basicsize = sizeof(Traced),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_doc = "The core of a traced() wrapper: run(args, kwargs) (see api.py).",
    .tp_traverse = (traverseproc)traced_traverse,
    .tp_clear = (inquiry)traced_clear,
    .tp_dealloc = (destructor)traced_dealloc,
    .tp_new = traced_new,
    .tp_call = PyVectorcall_Call,
    .tp_vectorcall_offset = offsetof(Traced, vectorcall),
};

static PyObject *
fast_setup_api(PyObject *module, PyObject *args)
{
    PyObject *rtype, *key;
    if (!PyArg_ParseTuple(args, "O!U", &PyType_Type, &rtype, &key)) {
        return NULL;
    }
    Py_XSETREF(recorder_type, Py_NewRef(rtype));
    Py_XSETREF(env_count_key, Py_NewRef(key));
    Py_RETURN_NONE;
}

static PyObject *
fast_default_changed(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    default_epoch++;
    Py_RETURN_NONE;
}

static PyObject *
fast_default_epoch(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLongLong(default_epoch);
}

static PyObject *
fast_remember_default(PyObject *module, PyObject *args)
{
    PyObject *rec;
    long long epoch;
    if (!PyArg_ParseTuple(args, "OL", &rec, &epoch)) {
        return NULL;
    }
    PyObject *held = rec == Py_None ? Py_NewRef(Py_None) : PyWeakref_NewRef(rec, NULL);
    if (held == NULL) {
        return NULL;
    }
    Py_XSETREF(tls_default, held);
    tls_default_epoch = epoch;
    Py_RETURN_NONE;
}

/* ---------------------------------------------------------------- module */
static PyObject *
fast_set_clock(PyObject *module, PyObject *fn)
{
    if (fn == Py_None) {
        Py_CLEAR(clock_fn);
    }
    else {
        Py_XSETREF(clock_fn, Py_NewRef(fn));
    }
    Py_RETURN_NONE;
}

static PyObject *
fast_setup(PyObject *module, PyObject *args)
{
    PyObject *fn;
    Py_ssize_t m;
    if (!PyArg_ParseTuple(args, "On", &fn, &m)) {
        return NULL;
    }
    Py_XSETREF(error_code_fn, Py_NewRef(fn));
    max_recs = m;
    Py_RETURN_NONE;
}

static PyObject *
fast_set_max_records(PyObject *module, PyObject *arg)
{
    Py_ssize_t m = PyLong_AsSsize_t(arg);
    if (m == -1 && PyErr_Occurred()) {
        return NULL;
    }
    max_recs = m;
    Py_RETURN_NONE;
}

static PyObject *
fast_now(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    long long t;
    if (now_ns(&t) < 0) {
        return NULL;
    }
    return PyLong_FromLongLong(t);
}

static PyObject *
fast_count(PyObject *module, PyObject *value)
{
    PyObject *c = count_fast(value);
    if (c == NULL && !PyErr_Occurred()) {
        Py_RETURN_NONE;
    }
    return c;
}

static PyObject *
fast_setup_recorder(PyObject *module, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"scope", "enter", "exit", "lap", "timing", "sink_failed",
                             "adopt", NULL};
    PyObject *sc, *en, *ex, *lp, *tm, *sf, *ad;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOOOO", kwlist, &sc, &en, &ex, &lp, &tm,
                                     &sf, &ad)) {
        return NULL;
    }
    Py_XSETREF(adopt_general, Py_NewRef(ad));
    Py_XSETREF(timing_general, Py_NewRef(tm));
    Py_XSETREF(sink_failed, Py_NewRef(sf));
    Py_XSETREF(scope_general, Py_NewRef(sc));
    Py_XSETREF(enter_general, Py_NewRef(en));
    Py_XSETREF(exit_general, Py_NewRef(ex));
    Py_XSETREF(lap_general, Py_NewRef(lp));
    Py_RETURN_NONE;
}

static PyMethodDef fast_methods[] = {
    {"setup_recorder", (PyCFunction)(void (*)(void))fast_setup_recorder,
     METH_VARARGS | METH_KEYWORDS,
     "setup_recorder(scope, enter, exit, lap, timing, sink_failed, adopt): the Python "
     "implementations of every case the C methods hand over (Recorder.scope, "
     "Scope.__enter__, __exit__, lap and timing, Recorder._adopt) and what logs a trace "
     "sink's failure."},
    {"count", fast_count, METH_O,
     "The count a traced call reads from value in C (api.count_of's), or None: not known "
     "here (api.count_of takes it)."},
    {"catalog_changed", fast_catalog_changed, METH_NOARGS,
     "A phase was registered: every layout made before is out of date."},
    {"catalog_epoch", fast_catalog_epoch, METH_NOARGS,
     "The epoch a layout made now is made at (see catalog_changed)."},
    {"set_clock", fast_set_clock, METH_O,
     "The clock the records read (a function returning ns), or None: perf_counter_ns."},
    {"setup", fast_setup, METH_VARARGS,
     "setup(error_code, max_records): the recorder module's error_code and the records "
     "a trace may hold."},
    {"set_max_records", fast_set_max_records, METH_O,
     "The records a trace may hold (recorder.set_max_trace_records)."},
    {"now", fast_now, METH_NOARGS, "The clock the records read, in ns."},
    {"setup_api", fast_setup_api, METH_VARARGS,
     "setup_api(Recorder, env_count_key): what api.py defines."},
    {"default_changed", fast_default_changed, METH_NOARGS,
     "The default session changed (made, replaced, shut down): every thread's remembered "
     "default recorder is out of date."},
    {"default_epoch", fast_default_epoch, METH_NOARGS,
     "The epoch a default recorder resolved now is resolved at (see default_changed)."},
    {"remember_default", fast_remember_default, METH_VARARGS,
     "remember_default(recorder or None, epoch): this thread's default recorder, as "
     "resolved at epoch (None: tracing off), for the traced calls no trace or bound "
     "recorder takes."},
    {NULL},
};

static struct PyModuleDef fast_module = {
    PyModuleDef_HEAD_INIT, "resettrace.tracing._fast",
    "The recorder's hot path in C (optional; see the source's header).", -1, fast_methods,
};

PyMODINIT_FUNC
PyInit__fast(void)
{
#define INTERN(var, s) if ((var = PyUnicode_InternFromString(s)) == NULL) return NULL
    INTERN(str_index, "index");
    INTERN(str_name, "__name__");
    INTERN(str_on_trace, "on_trace");
    INTERN(str_trace_queue, "trace_queue");
    INTERN(str_attributes, "attributes");
    INTERN(str_exit, "__exit__");
    INTERN(str_catalog, "catalog");
    INTERN(str_call, "call");
    INTERN(str_call_leaf, "call_leaf");
#undef INTERN
    zero = PyLong_FromLong(0);
    no_count = PyLong_FromLong(-1);
    if (zero == NULL || no_count == NULL
            || PyType_Ready(&TracedType) < 0 || PyType_Ready(&ScopeBaseType) < 0
            || PyType_Ready(&RecorderBaseType) < 0 || PyType_Ready(&SlotType) < 0
            || PyType_Ready(&TraceType) < 0 || PyType_Ready(&TraceQueueType) < 0
            || PyType_Ready(&TraceLogType) < 0
            || PyType_Ready(&RecordsType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&fast_module);
    if (m == NULL) {
        return NULL;
    }
    if (PyModule_AddObjectRef(m, "ScopeBase", (PyObject *)&ScopeBaseType) < 0
            || PyModule_AddObjectRef(m, "RecorderBase", (PyObject *)&RecorderBaseType) < 0
            || PyModule_AddObjectRef(m, "Slot", (PyObject *)&SlotType) < 0
            || PyModule_AddObjectRef(m, "Trace", (PyObject *)&TraceType) < 0
            || PyModule_AddObjectRef(m, "Records", (PyObject *)&RecordsType) < 0
            || PyModule_AddObjectRef(m, "TraceQueue", (PyObject *)&TraceQueueType) < 0
            || PyModule_AddObjectRef(m, "TraceLog", (PyObject *)&TraceLogType) < 0
            || PyModule_AddObjectRef(m, "Traced", (PyObject *)&TracedType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
