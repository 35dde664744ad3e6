"""Checkpoints: the file format, one-file and sharded (``torch.distributed.checkpoint``) backends,
resume under the same or a new plan, and the agreement on the resume step."""
