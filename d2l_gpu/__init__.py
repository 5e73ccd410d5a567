"""d2l_gpu: the helpers of the d2l-gpu lessons, with the book's names (`import d2l_gpu as d2l`).

The package is lazy: `import d2l_gpu` imports no submodule. A name such as `d2l.try_gpu` imports
its module the first time it is used (PEP 562), so a process that needs only the data layer, such
as each rank that torchrun starts, never pays for matplotlib. `_NAMES` says where each name lives.

Layout: the top level says the role, each subpackage holds one kind of thing.

    core (top level)  devices, models and gpt (every model, once), training, recipe,
                      plotting, perf, profiling, distributed, gloo, workers, processes, jobs,
                      stopping, torchrun (private torchrun for one machine, a command), ddp (the
                      training script's first name), _checks (argument checks), _typed (each
                      public name says which argument misfits), _capped (a rank's output, cut
                      after 2**20 characters), _fs, _live
    data/             Fashion-MNIST, the IDX format, batching arguments, downloads, toy workloads
    parallel/         one module per parallelism technique the lessons build (see its docstring)
    book/             the book's own names and classes (HyperParameters, Trainer, train_ch6, ...)
    train/            the training script, `python -m d2l_gpu.train` (`python -m d2l_gpu.ddp`
                      is its old name): config, loop, epochs, checkpoint, strategies/

Import rule (tests/test_layout.py reads every import, also those inside functions):

    core      imports only core
    data      imports core and data
    parallel  imports core, data and parallel
    book      imports core, data and book
    train     imports core, data, parallel and train
    nothing imports train or book; this file imports no module at import time (only `_NAMES`)
    and no two modules import each other, directly or around a loop.
"""

from __future__ import annotations

import importlib

__version__ = "0.2.0"

# module -> the public names it gives to `d2l.`: core first, then data/, parallel/, book/.
_NAMES = {
    # core
    "devices": [
        "accelerator_type",
        "by_profile",
        "cpu",
        "describe_profile",
        "devices_report",
        "gpu",
        "is_out_of_memory",
        "num_gpus",
        "profile",
        "synchronize",
        "try_all_gpus",
        "try_gpu",
    ],
    "distributed": ["free_port", "pick_backend", "rank_device", "torch_at_least"],
    "jobs": ["kill_worker", "launch", "launch_and_kill", "launch_nodes", "run_job"],
    "models": [
        "LeNet",
        "Residual",
        "has_lazy",
        "init_every_layer",
        "init_weights",
        "lenet",
        "lenet_blocks",
        "lenet_params",
        "lenet_sequential",
        "materialize",
        "mlp",
        "resnet18",
        "resnet_block",
    ],
    "perf": [
        "HostWaits",
        "PEAK_TFLOPS",
        "cpu_name",
        "device_name",
        "examples_per_second",
        "measure",
        "measured_on",
        "peak_tflops",
        "training_flops",
    ],
    "gpt": ["TransformerBlock", "transformer"],
    "profiling": [
        "ddp_scaling_worker",
        "ddp_trace_worker",
        "overlap_us",
        "plot_trace",
        "profile_step",
        "spans",
        "trace_events",
    ],
    "plotting": ["Animator", "bars", "plot", "plt", "set_axes", "set_figsize", "show_images"],
    "recipe": [
        "Recipe",
        "amp_dtype",
        "make_step",
        "native_low_precision",
        "train_concise",
        "warmup_cosine",
    ],
    "training": [
        "Accumulator",
        "Timer",
        "accuracy",
        "data_parallel",
        "evaluate_accuracy_gpu",
        "scale_for_devices",
        "sgd",
    ],
    "workers": ["run_workers"],
    # data/
    "data.fashion_mnist": [
        "DataError",
        "fashion_mnist_dir",
        "get_fashion_mnist_labels",
        "load_data_fashion_mnist",
        "read_fashion_mnist",
    ],
    "data.text": ["CHARS", "decode", "encode", "python_help_text", "text_batch"],
    "data.toy": ["toy_data", "toy_images"],
    # parallel/: one technique per module
    "parallel.collectives": [
        "ALGORITHMS",
        "check_worker",
        "exchange",
        "hierarchical_all_reduce",
        "key_ranges",
        "open_reverse_links",
        "ps_push_pull",
        "ring_all_reduce",
    ],
    "parallel.own_collective": ["own_all_reduce_worker"],
    "parallel.own_stage": ["own_stage_worker"],
    "parallel.own_sequence": ["own_sequence_worker"],
    "parallel.own_ring": ["own_ring_worker"],
    "parallel.overlap": ["backward_overlap_worker", "layer_stack"],
    "parallel.server_steps": ["server_step_worker"],
    "parallel.costmodel": [
        "AlphaBeta",
        "collective_worker",
        "fit_alpha_beta",
        "hierarchical_time",
        "overlap_worker",
        "pingpong_worker",
        "pipeline_time",
        "ps_time",
        "ring_time",
        "time_ops",
    ],
    "parallel.data_parallel": [
        "allreduce",
        "evaluate_accuracy_parallel",
        "flat_grads",
        "get_params",
        "reduce_scatter_all_gather",
        "split_batch",
        "train_batch",
        "train_parallel",
    ],
    "parallel.expert_parallel": [
        "ExpertParallelMoE",
        "MoE",
        "Routing",
        "all_to_all_bytes",
        "gather_experts",
        "sent_matrix",
    ],
    "parallel.footprint": [
        "CollectiveCounter",
        "MemoryMeter",
        "allocated_bytes",
        "step_seconds",
        "tensor_bytes",
        "train_measured",
    ],
    "parallel.fsdp": ["fsdp_worker"],
    "parallel.memory": [
        "Checkpointed",
        "OPTIMIZER_STATES",
        "activation_bytes",
        "bytes_per_rank",
        "checkpoint_every",
        "memory_breakdown",
    ],
    "parallel.moe_worker": ["MoEWorkload", "expert_parallel_worker", "train_moe_one_device"],
    "parallel.pipeline": ["pipeline_worker", "torch_pipeline_worker"],
    "parallel.ulysses": ["UlyssesBlock", "ulysses_attention", "ulysses_worker"],
    "parallel.interleaved": ["interleaved_pipeline_worker", "stages_of_rank"],
    "parallel.schedules": [
        "SCHEDULES",
        "bubble_fraction",
        "gpipe_schedule",
        "idle_fraction",
        "max_in_flight",
        "model_parallel_step",
        "one_f_one_b_schedule",
        "place_stages",
        "run_schedule",
        "simulate_schedule",
        "stage_backward",
        "stage_devices",
        "stage_forward",
        "walk_schedule",
    ],
    "parallel.sequence_parallel": [
        "GatherSequence",
        "ScatterSequence",
        "activation_bytes_per_rank",
        "all_reduce_norm_grads",
        "parallel_transformer",
        "sequence_parallel_block",
        "transformer_parallel_worker",
    ],
    "parallel.splitting": [
        "balanced_cuts",
        "channel_split",
        "layer_table",
        "split_costs",
        "split_stages",
    ],
    "parallel.context_parallel": [
        "causal_work",
        "merge",
        "ring_attention",
        "shard_sequence",
        "unshard_sequence",
    ],
    "parallel.cp_worker": ["context_parallel_transformer", "context_parallel_worker", "ring_bytes"],
    "parallel.mesh": [
        "build_mesh_model",
        "held_bytes",
        "load_sharded",
        "mesh_resume_worker",
        "mesh_save_worker",
        "mesh_worker",
        "predict_mesh",
        "save_sharded",
        "split_over_mesh",
        "step_collectives",
        "step_collectives_worker",
        "train_mesh",
    ],
    "parallel.mesh3d": ["gpipe_step", "mesh3d_worker", "predict_mesh3d", "stage_units"],
    "parallel.sync_batchnorm": ["GlobalBatchNorm", "sync_batchnorm"],
    "parallel.tensor_parallel": [
        "ChannelParallelConv2d",
        "ColumnParallelLinear",
        "RowParallelLinear",
        "channel_parallel_convs",
        "channel_parallel_lenet",
        "full_parameters",
        "megatron_mlp",
        "tensor_parallel_worker",
        "torch_tensor_parallel_worker",
    ],
    "parallel.transformer_parallel": [
        "HeadParallelBlock",
        "full_transformer_parameters",
        "group_qkv",
        "parallelize_transformer",
        "tensor_parallel_block",
        "tp_time_estimate",
        "ungroup_qkv",
    ],
    "parallel.workload": [
        "TransformerWorkload",
        "Workload",
        "make_optimizer",
        "train_one_device",
        "train_transformer",
        "transformer_loss",
    ],
    "parallel.zero": [
        "ShardedLayer",
        "adam_step",
        "zero_stages_worker",
        "zero_step",
        "zero_worker",
    ],
    # book/: the book's own names
    "book.aliases": [
        "abs",
        "arange",
        "argmax",
        "astype",
        "batch_matmul",
        "concat",
        "cos",
        "cosh",
        "exp",
        "expand_dims",
        "eye",
        "float32",
        "int32",
        "int64",
        "linspace",
        "log",
        "matmul",
        "meshgrid",
        "normal",
        "numpy",
        "ones",
        "ones_like",
        "rand",
        "randn",
        "reduce_mean",
        "reduce_sum",
        "repeat",
        "reshape",
        "sigmoid",
        "sin",
        "sinh",
        "size",
        "stack",
        "swapaxes",
        "tanh",
        "tensor",
        "to",
        "transpose",
        "zeros",
        "zeros_like",
    ],
    "book.board": ["ProgressBoard"],
    "book.chapters": ["train_batch_ch13", "train_ch13", "train_ch6"],
    "book.classes": ["Classifier", "DataModule", "Module", "init_cnn"],
    "book.data": ["FashionMNIST"],
    "book.dataset": ["BookStyleDataset", "load_data_book_style"],
    "book.hparams": ["HyperParameters", "add_to_class"],
    "book.trainer": ["Trainer"],
}
_WHERE = {name: module for module, names in _NAMES.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """Import the module that defines `name` on first use, then cache the name here."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'd2l_gpu' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
