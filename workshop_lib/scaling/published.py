"""Published figures the scaling model uses and is checked against: workloads, links, Horovod's benchmark."""

from __future__ import annotations

from workshop_lib.scaling.cost import ComputeCurve, Link, MiB, Workload, project

# Parameter counts are torchvision's / Hugging Face's. Compute per step comes from a published
# throughput at the batch named; see each source.
WORKLOADS = {
    "ResNet-50": Workload(
        "ResNet-50", 25_557_032, ComputeCurve((256,), (256 / 2470,)), batch=256,
        source="NVIDIA DeepLearningExamples, PyTorch ResNet50 v1.5 README: 2470 img/s on 1 A100 80GB, "
               "mixed precision, batch 256 per GPU"),
    "GPT-2 124M": Workload(
        "GPT-2 124M", 124_439_808, ComputeCurve((12,), (4 * 86400 * 8 / (600_000 * 40),)), batch=12,
        accumulation=5,
        source="nanoGPT README and config/train_gpt2.py: GPT-2 124M in about 4 days on 8 A100 40GB, "
               "600,000 steps of 40 micro-batches of 12 x 1024 tokens (5 micro-batches per GPU per all-reduce)"),
}

GBIT = 1e9 / 8
NVLINK = Link("8 GPUs, NVLink (H100)", alpha=5e-6, beta=450e9, max_ranks=8,
              source="NVIDIA H100 SXM datasheet: NVLink 900 GB/s per GPU, both directions together; "
                     "alpha is an assumed few microseconds")
LINKS = {
    "NVLink, 8 GPUs": NVLINK,
    "InfiniBand NDR, nodes of 8": Link(
        "InfiniBand NDR 400 Gb/s per GPU, nodes of 8 on NVLink", alpha=10e-6, beta=400 * GBIT, max_ranks=1024,
        source="NVIDIA DGX H100: one 400 Gb/s ConnectX-7 (NDR) port per GPU; alpha is an assumed 10 microseconds",
        node=NVLINK, node_size=8, algorithm="double-tree"),
    "Ethernet 25 Gb/s, nodes of 8": Link(
        "Ethernet 25 Gb/s per node, nodes of 8 on NVLink", alpha=10e-6, beta=25 * GBIT, max_ranks=1024,
        source="one 25 Gb/s port per node, as in Horovod's benchmark; alpha is an assumed 10 microseconds",
        node=NVLINK, node_size=8, algorithm="double-tree"),
}

# The published scaling result the model is checked against: Horovod's benchmark, 128 servers with
# 4 Pascal GPUs each on a RoCE-capable 25 Gbit/s network, tf_cnn_benchmarks at batch 64 per GPU.
HOROVOD = {
    "source": "Horovod docs, 'Benchmarks' (github.com/horovod/horovod, docs/benchmarks.rst): 90% scaling efficiency "
              "for Inception V3 and ResNet-101, 68% for VGG-16, on 512 GPUs",
    "ranks": 512,
    "link": Link("RoCE 25 Gbit/s, 4 GPUs per server", alpha=10e-6, beta=25 * GBIT, max_ranks=512,
                 source="Horovod benchmark setup; the network card is shared by the server's 4 GPUs, whose ring "
                        "crosses it once each way; alpha is assumed"),
    "published_efficiency": {"ResNet-101": 0.90, "VGG-16": 0.68},
    # Compute: ResNet-101 at ~103.6 img/s per GPU, from the 16-GPU example run in the same page
    # ("total images/sec: 1656.82", batch 64); VGG-16 at the same FLOP rate, by the forward FLOPs that
    # He et al. 2016 give (ResNet-101 7.6 G, VGG-16 15.3 G multiply-adds per image).
    "workloads": {
        "ResNet-101": Workload("ResNet-101", 44_549_160, ComputeCurve((64,), (64 * 16 / 1656.82,)), batch=64,
                               bucket_bytes=64 * MiB),
        "VGG-16": Workload("VGG-16", 138_357_544, ComputeCurve((64,), (64 * 16 / 1656.82 * 15.3 / 7.6,)), batch=64,
                           bucket_bytes=64 * MiB),
    },
}


def horovod_check(overlap: float = 0.0) -> list[dict]:
    """The model's efficiency at 512 GPUs for Horovod's benchmark, beside the published one."""
    rows = []
    for name, work in HOROVOD["workloads"].items():
        eff = project(work, HOROVOD["link"], [HOROVOD["ranks"]], overlap=overlap)[0]["efficiency"]
        pub = HOROVOD["published_efficiency"][name]
        rows.append({"model": name, "params": work.params, "overlap": overlap, "predicted_efficiency": eff,
                     "published_efficiency": pub, "error_points": 100 * (eff - pub)})
    return rows
