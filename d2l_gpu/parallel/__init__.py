"""The parallelism techniques of the lessons, one module per technique, built by hand and with
PyTorch's APIs:

data_parallel.py   data parallelism from scratch (lesson 5)
sync_batchnorm.py  BatchNorm over every rank's examples, on any device (--sync-bn; lesson 7)
schedules.py       pipeline schedules, their simulation and execution over stages (lesson 10)
pipeline.py        pipelines across processes, by hand and with torch.distributed.pipelining (10)
splitting.py       cutting a model into stages and what each split costs (lesson 10)
interleaved.py     interleaved 1F1B and zero-bubble schedules: several stages per rank (10)
own_stage.py       a student's own pipeline stage on real ranks, checked against one device (10)
context_parallel.py context parallelism: sequence layouts and ring attention (lesson 14)
cp_worker.py       the small transformer trained context-parallel, and what one step sends (14)
ulysses.py         Ulysses context parallelism: attention by heads after an all-to-all (14)
own_ring.py        a student's own hop of ring attention's ring, trained on real ranks (14)
tensor_parallel.py tensor (Megatron) and channel parallelism (lesson 10)
transformer_parallel.py  the transformer's heads and MLP split over ranks (Megatron TP, DTensor; 13)
sequence_parallel.py     sequence parallelism on top of it, and the worker that trains both (13)
own_sequence.py    a student's own reduce-scatter along the sequence, trained on real ranks (13)
zero.py            ZeRO stages 1-3 from scratch (lesson 11)
fsdp.py            PyTorch's fully sharded data parallelism, FSDP2 (lesson 11)
memory.py          memory accounting: what each rank holds (lesson 11)
footprint.py       memory and collectives measured while a worker trains (lessons 10, 11)
workload.py        the jobs the workers train and the one-device runs they are compared with
collectives.py     all-reduce algorithms: ring, hierarchical, parameter server (lesson 12)
costmodel.py       the alpha-beta cost model and its measurement (lesson 12)
overlap.py         a real backward pass overlapped with its buckets' all-reduces, traced (12)
server_steps.py    training steps through parameter servers with a real backward pass (12)
own_collective.py  a student's own all-reduce, checked, counted by direction and timed (12)
expert_parallel.py mixture of experts (MoE) and expert parallelism with all-to-all (lesson 13)
moe_worker.py      the MoE job, its one-device reference and the expert-parallel worker (13)
mesh.py            2-D device meshes (FSDP2 x TP) and resharding checkpoints (DCP; lesson 14)
mesh3d.py          3-D meshes: pipeline stages, each a 2-D mesh of FSDP2 x TP (lesson 14)
worker_args.py     the argument checks of the workers above, before any message is sent

A new technique gets a module here.
Imports core and d2l_gpu.data only; importing this package imports nothing else.
"""
