"""FlashAttention, step by step — docs/bench/palette.py: one colour per stage and per peer, in every plot.

plot.py (the sweeps) and plot_ablation.py (step 6's ablation) both take their colours from here, so a
colour means the same thing in every figure of the course: step 4 is orange in the forward sweep, in
step 6's tuned-against-default plot and in the ablation's bars. Stages are solid lines with filled
markers; a stage's second variant keeps its colour and changes the line; peers are dashed with hollow
markers; the mma.sync ceiling measured in the plotted run is the one red line.
"""

# tab10's colours, one per stage, in the order of the course. Red is left out: it is the ceiling's.
STAGE_COLORS = {
    "step1_cpu_reference": "#8c564b",    # brown
    "step2_online_softmax": "#bcbd22",   # olive
    "step3_naive_kernel": "#1f77b4",     # blue
    "step4_fused_pipelined": "#ff7f0e",  # orange
    "step5_backward": "#2ca02c",         # green
    "step6_autotune": "#9467bd",         # purple
    "step7_hopper_wgmma": "#e377c2",     # pink
}
OTHER_STAGE_COLOR = "#17becf"            # cyan: a stage this table does not know yet

# The PyTorch peers of the sweep: (legend label, colour, marker).
PEERS = {
    "torch_sdpa_flash": ("PyTorch SDPA (flash)", "#7f7f7f", "^"),
    "torch_sdpa_cudnn": ("PyTorch SDPA (cuDNN)", "black", "s"),
}

CEILING_COLOR = "firebrick"

# A variant that is not its stage's default keeps the stage's colour and gets its own line and marker.
# Step 4's sub-steps go from pale to full orange; 4d, the default kernel, is the stage's own line. Step 7's
# go the same way in pink; 7c, its last, is the stage's own line.
VARIANT_LINES = {
    "atomic": dict(linestyle="-.", marker="D"),
    # 4a and 4b run within a few percent of each other: a small filled marker on a dotted line, and a large
    # hollow one on a dash-dot line, so that both show where they lie on top of each other.
    "4a-padded": dict(linestyle=":", marker="v", color="#fdae6b"),
    "4b-swizzle": dict(linestyle="-.", marker="^", color="#fd8d3c", markerfacecolor="none", markersize=8.5),
    "4c-cp-async": dict(linestyle="--", marker="s", color="#d94801"),
    "4d-tma": dict(linestyle="-", marker="o"),
    "7a-wgmma": dict(linestyle=":", marker="v", color="#f1b6da"),
    "7b-specialized": dict(linestyle="--", marker="s", color="#c51b7d"),
    "7c-pingpong": dict(linestyle="-", marker="o"),
}

# A stage's variant that VARIANT_LINES does not name (step 7's 7c with other tiles, say) takes the next of
# these, so that no two lines of a figure look alike.
OTHER_VARIANT_LINES = [
    dict(linestyle=(0, (6, 2)), marker="P", markersize=7),
    dict(linestyle=(0, (1, 1)), marker="X", markersize=7),
    dict(linestyle=(0, (5, 1, 1, 1, 1, 1)), marker="h", markerfacecolor="none", markersize=8),
    dict(linestyle=(0, (3, 1, 1, 1)), marker="*", markersize=8),
]

# Implementations that multiply with wgmma (Hopper's warpgroup MMA), not mma.sync: their ceiling is higher
# than the red line, which is mma.sync's (steps 3-6 and PyTorch's flash backend, FlashAttention 2, use
# mma.sync). A plot where one of them passes the red line says so.
WGMMA = {
    "torch_sdpa_cudnn": "PyTorch SDPA (cuDNN)",
    "step7_hopper_wgmma": "step7_hopper_wgmma",
}

# Step 6 runs step 4's forward and step 5's backward kernels; its "default" variant is those stages in
# their untuned default configuration, so it is drawn in their colour.
DEFAULT_CONFIGURATION_OF = {
    ("step6_autotune", "fwd"): "step4_fused_pipelined",
    ("step6_autotune", "bwd"): "step5_backward",
}


# The decode sweep (plot_decode.py) has one column of panels per batch size B and one line per
# implementation and head dim: colour, line and marker say the stage or peer, as in every plot. Runs of one
# stage with different --stage-flags (split-KV's --splits N) keep its colour and take these lines in turn
# ("--" is the peers').
DECODE_FLAG_LINES = ["-", "-.", ":", (0, (5, 1, 1, 1, 1, 1))]


def stage_color(name):
    return STAGE_COLORS.get(name, OTHER_STAGE_COLOR)


def peer_label(name):
    return PEERS[name][0] if name in PEERS else name


def line_style(kind, name, variant=""):
    """matplotlib keyword arguments for one series of a sweep plot."""
    if kind == "peer":
        _, color, marker = PEERS.get(name, (name, "dimgray", "v"))
        return dict(color=color, marker=marker, linestyle="--", markerfacecolor="none", markersize=7.5)
    return {"color": stage_color(name), **VARIANT_LINES.get(variant, dict(linestyle="-", marker="o"))}
