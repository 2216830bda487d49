"""Small OS helpers: procfs, pidfds, prctl, process spawning, cgroupfs.

Nothing here keeps state about a run; the engines do.
"""
