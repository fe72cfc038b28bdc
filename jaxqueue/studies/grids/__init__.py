"""Grid experiments: specs, their points and batches, the resumable result store, its
exports, and the theory, sensitivity and paired rows beside the simulated points."""
