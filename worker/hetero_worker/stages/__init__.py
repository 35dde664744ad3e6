"""Pipeline stages across GPU types (issue 30, item 3; first slice): the user's model as a
sequence of blocks cut into contiguous stages (:mod:`.split`), each rank running its stage under
``torch.distributed.pipelining`` with activations and their gradients sent over a Gloo group
(:mod:`.runner`; the communicator rule: no NCCL communicator spans GPU types), and data
parallelism inside every stage with the same replica count per stage (:mod:`.layout`); the
Trainer's part that runs them from the rank env contract is :mod:`hetero_worker.pipelinepart` (the trainer floor).

Not built yet: uneven replica counts per stage, CUDA tensors through the Gloo sends, fp16/bf16
and one loss scale across stages, checkpoints and metrics per stage.
"""
