"""Click commands for `layers` and `compact`: options -> LayerSpec/CompactSpec -> the engine."""

import click

from tracestream.cli.options import (
    PassesType,
    compress_option,
    emit_summary,
    event_limit,
    examples,
    json_summary_option,
    level_option,
    output_option,
    pid_value,
    quiet_option,
    refuse_summary_on_input,
    report_option,
    spool_option,
    trace_option,
    workers_option,
)
from tracestream.cli.progress import progress_for
from tracestream.errors import Option, SpecError

LAYERS_EXAMPLES = examples(
    "tracestream layers --trace TP-0.trace.json.gz --output TP-0.layers.trace.json.gz "
    "--anchor-regex '^_q_rope_store$' --num-layers 40 --anchor-offset 0 --passes all "
    "--phase target-verify --evidence 'anchors: one Q-store per layer' --max-gpu-lanes 10",
    "zcat TP-0.trace.json.gz | tracestream layers --trace - --output TP-0.layers.trace.json "
    "--anchor-regex '^_q_rope_store$' --num-layers 40 --anchor-offset 0 --passes 20 "
    "--phase target-verify --evidence 'anchors: one Q-store per layer'")
COMPACT_EXAMPLES = examples(
    "tracestream compact --trace TP-0.trace.json.gz --output TP-0.compact.trace.json.gz",
    "tracestream compact --trace TP-0.trace.json.gz --output TP-0.compact.trace.json.gz "
    "--lane-groups auto --lane-group gemm='^(nvjet|sm90_xmma)'",
    "tracestream compact --trace TP-0.trace.json.gz --output TP-0.compact.json.zst "
    "--max-gpu-lanes 4")


def lane_group_options(command):
    """`--lane-groups auto` and `--lane-group NAME=REGEX` (compact, and layers with
    --max-gpu-lanes)."""
    command = click.option(
        "--lane-group", "lane_group", multiple=True, metavar="NAME=REGEX",
        help="A custom lane group: kernels whose name matches REGEX (re.search; the first "
             "matching --lane-group wins) get lanes of their own, after the built-in groups. "
             "Repeatable.")(command)
    return click.option(
        "--lane-groups", "lane_groups", type=click.Choice(["auto"]), default=None,
        help="Give compute, communication (NCCL and collective kernels), memory (copies, "
             "memsets) and sync activity lanes of their own, in that order; the lanes of a "
             "device still add up to at most --max-gpu-lanes.")(command)


def time_window_option(command):
    return click.option(
        "--time-window", "time_window", default=None, metavar="START:END",
        help="Write only the events of this time range: milliseconds from the trace origin "
             "(as the report and `anchors` count them; exact decimals; either end may be left "
             "out). Metadata stays; a slice that crosses an edge is kept; a flow only whole. "
             "See docs/windows.md.")(command)


def split_option(command):
    return click.option(
        "--split-mb", "split_mb", default=None, metavar="N",
        help="Write the output as pieces of at most N MB of JSON each (10^6 bytes; one pass "
             "per piece where a pass is larger), cut between passes when there are guides, "
             "named OUTPUT-STEM.part-0001.json…, each with its report, and the manifest "
             "OUTPUT.pieces.json (`tracestream view --trace OUTPUT.pieces.json` lists them). "
             "See docs/windows.md.")(command)


def window_spec(pass_window: str | None, time_window: str | None, split_mb: str | None):
    """The WindowSpec of --pass-window or --time-window, or the SplitSpec of --split-mb
    (None: the whole trace, in one file)."""
    from tracestream.plan import window

    given = [name for name, value in (("--pass-window", pass_window),
                                      ("--time-window", time_window),
                                      ("--split-mb", split_mb)) if value is not None]
    if len(given) > 1:
        raise SpecError(f"{' and '.join(given)} each choose what the output holds: give one")
    if pass_window is not None:
        return window.pass_window(pass_window)
    if split_mb is not None:
        return window.split_mb(split_mb)
    return window.time_window(time_window) if time_window is not None else None


def lane_group_fields(lane_groups, lane_group) -> dict:
    """The CompactSpec fields of the two options (none when neither is given)."""
    from tracestream.plan.specs import lane_group_option

    fields = {}
    if lane_groups is not None:
        fields["lane_groups"] = lane_groups
    if lane_group:
        fields["lane_group"] = tuple(map(lane_group_option, lane_group))
    return fields


def register(main) -> None:
    """Add the commands to the `tracestream` group."""

    @main.command(epilog=LAYERS_EXAMPLES)
    @trace_option
    @output_option
    @click.option("--anchor-regex", required=True, metavar="REGEX",
                  help="Kernel name pattern (Python re.search) of the verified once-per-layer "
                       "anchor.")
    @click.option("--num-layers", type=int, required=True, metavar="N", help="Layers per pass.")
    @click.option("--anchor-offset", type=int, required=True, metavar="K",
                  help="Index (in time order) of the match that starts the verified first layer.")
    @click.option("--passes", type=PassesType(), default=1, show_default=True, metavar="P|all",
                  help="Complete passes to label; all: every complete pass from the offset.")
    @click.option("--anchor-stride", type=int, default=1, show_default=True, metavar="S",
                  help="Anchor matches per layer (keep every S-th).")
    @click.option("--extra-anchors-per-pass", type=int, default=0, show_default=True, metavar="E",
                  help="Matches after each pass's last layer to skip before the next pass.")
    @click.option("--first-layer", type=int, default=0, show_default=True, metavar="F",
                  help="Number of the first labelled layer (pipeline partitions).")
    @click.option("--end-anchor-regex", default=None, metavar="REGEX",
                  help="Terminal kernel that ends each layer (once per layer); the last layer's "
                       "guide ends at its end.")
    @click.option("--phase", required=True,
                  help="Which phase the guides label, e.g. target-verify.")
    @click.option("--evidence", required=True,
                  help="How you verified the anchor and L0 (kept in every guide and the report).")
    @click.option("--pid", default=None, metavar="PID", help="GPU process of the anchors.")
    @click.option("--device", default=None, metavar="D", help="args.device of the anchors.")
    @click.option("--max-gpu-lanes", type=int, default=None, metavar="N",
                  help="Also compact GPU activity into at most N (1-10) display lanes.")
    @lane_group_options
    @click.option("--gap-factor", type=float, default=None, metavar="F",
                  help="A gap between two layers of a pass longer than F x the median layer gap is "
                       "a cadence break (the rule of `anchors`) [default: 3].")
    @click.option("--allow-gaps", is_flag=True,
                  help="Label passes that cross a cadence break anyway (recorded in the report).")
    @click.option("--allow-several-anchor-names", is_flag=True,
                  help="Accept a pattern that matches several kernel names (recorded in the "
                       "report).")
    @click.option("--pass-window", "pass_window", default=None, metavar="FIRST:STOP",
                  help="Write only passes FIRST … STOP-1 of the labelled selection: from pass "
                       "FIRST's L0 anchor to pass STOP's (FIRST: to the trace's end), with "
                       "whatever runs between the passes. Guides and lanes are planned on the "
                       "whole trace. See docs/windows.md.")
    @time_window_option
    @split_option
    @report_option
    @compress_option
    @level_option
    @workers_option
    @spool_option
    @quiet_option
    @json_summary_option
    def layers(trace, output, anchor_regex, num_layers, anchor_offset, passes, anchor_stride,
               extra_anchors_per_pass, first_layer, end_anchor_regex, phase, evidence, pid, device,
               max_gpu_lanes, lane_groups, lane_group, gap_factor, allow_gaps,
               allow_several_anchor_names, pass_window, time_window, split_mb, report,
               compress, compress_level, workers, spool_dir, quiet, json_summary):
        """Add verified L0, L1, … layer guides to a trace (optionally with the compact GPU view)."""
        from tracestream.engine import add_layer_guides
        from tracestream.plan.specs import CompactSpec, LayerSpec

        spec = LayerSpec(
            anchor_regex=anchor_regex, num_layers=num_layers, anchor_offset=anchor_offset,
            phase=phase, evidence=evidence, passes=passes, anchor_stride=anchor_stride,
            extra_anchors_per_pass=extra_anchors_per_pass, first_layer=first_layer,
            end_anchor_regex=end_anchor_regex, pid=pid_value(pid), device=pid_value(device),
            allow_gaps=allow_gaps, allow_several_anchor_names=allow_several_anchor_names,
            **({} if gap_factor is None else {"gap_factor": gap_factor}),
        )
        groups = lane_group_fields(lane_groups, lane_group)
        if groups and max_gpu_lanes is None:
            raise SpecError(Option(next(iter(groups))), " groups the lanes of compaction: give "
                            "it with ", Option("max_lanes"))
        compact_spec = (
            CompactSpec(max_lanes=max_gpu_lanes, pid=pid_value(pid), **groups)
            if max_gpu_lanes is not None else None
        )
        window = window_spec(pass_window, time_window, split_mb)
        refuse_summary_on_input(trace, json_summary, report, output)
        result = add_layer_guides(trace, output, spec, report=report, compact=compact_spec,
                                  compress=compress, compress_level=compress_level,
                                  progress=progress_for(quiet), workers=workers,
                                  max_event_bytes=event_limit(), spool_dir=spool_dir,
                                  window=window)
        emit_summary(result, json_summary, quiet)


    @main.command(epilog=COMPACT_EXAMPLES)
    @trace_option
    @output_option
    @click.option("--max-gpu-lanes", type=int, default=10, show_default=True, metavar="N",
                  help="Display lanes per device (1-10); refused if the peak overlap is higher.")
    @lane_group_options
    @click.option("--pid", default=None, metavar="PID", help="Compact only this GPU process.")
    @time_window_option
    @split_option
    @report_option
    @compress_option
    @level_option
    @workers_option
    @spool_option
    @quiet_option
    @json_summary_option
    def compact(trace, output, max_gpu_lanes, lane_groups, lane_group, pid, time_window,
                split_mb, report, compress, compress_level, workers, spool_dir, quiet,
                json_summary):
        """Pack GPU activity into at most N synthetic display lanes per device (a compact view)."""
        from tracestream.engine import compact as compact_trace
        from tracestream.plan.specs import CompactSpec

        refuse_summary_on_input(trace, json_summary, report, output)
        spec = CompactSpec(max_lanes=max_gpu_lanes, pid=pid_value(pid),
                           **lane_group_fields(lane_groups, lane_group))
        result = compact_trace(trace, output, spec, report=report, compress=compress,
                               compress_level=compress_level,
                               progress=progress_for(quiet), workers=workers,
                               max_event_bytes=event_limit(), spool_dir=spool_dir,
                               window=window_spec(None, time_window, split_mb))
        emit_summary(result, json_summary, quiet)
