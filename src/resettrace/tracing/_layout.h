/* A record's layout, written by `python -m resettrace.tracing.layout` from
 * layout.py (the one definition): do not edit. */
#ifndef RESETTRACE_LAYOUT_H
#define RESETTRACE_LAYOUT_H
#define R_PHASE 0
#define R_PARENT 1
#define R_START 2
#define R_END 3
#define R_COUNT 4
#define R_ERROR 5
#define RECORD_FIELDS 6
#define NO_COUNT (-1)
#endif
