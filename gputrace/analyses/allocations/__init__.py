"""Who holds what GPU memory, each piece told once?

The joined allocation model every "who holds what" view reads: `join` links the
per-layer lifetime rows (api, rm, uvm) that are one piece of memory, `rows` labels
each row with its process's exit and leak kind, `pieces` makes one row per piece,
and `held` gives each piece ONE size (taken from one layer, never added across
layers) and the interval it is held, so that a holder's figure at an instant or its
growth over a window is a sum over pieces. See docs/analyses/allocations.md.
"""
