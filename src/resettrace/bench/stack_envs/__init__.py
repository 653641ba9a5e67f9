"""Small envs of our own on the stacks users train on, as a user writes them: what the
tests of the shipped instrumentations and ``resettrace bench stacks`` run
(``gym_arm``: a Gymnasium MuJoCo env; ``motrixlab_arm``: a MotrixLab ``ManagerEnv``).
They import their stack (the ``stacks`` extra) when imported."""
