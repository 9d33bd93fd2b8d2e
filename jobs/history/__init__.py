"""History across jobs: one point's median per job in commit order, and the change points in it."""
