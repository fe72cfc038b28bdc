"""Mean fields that follow one server or one I-queue: JIQ without delete requests (a
tagged server) and JIQ-Threshold(z) (an I-queue's compositions)."""
