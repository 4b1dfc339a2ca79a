"""Generate gpuguard's Grafana dashboards as JSON files, with Grafana's grafana-foundation-sdk.

    python grafana/build.py           # write grafana/dashboards/*.json
    python grafana/build.py --check   # exit 1 if the committed files differ

Dashboards are code so that every query can be checked against docs/interfaces.md (metric,
label and recording-rule names, §5, §7, §8) and run against a real Prometheus in tests. The
committed JSON is what Grafana's file provisioning loads; tests/unit/test_dashboards.py
checks it equals this script's output. The SDK's types and builders are those of the
Grafana the JSON targets (pyproject.toml pins the SDK build; docs/dashboards.md says which).

Dashboard UIDs are fixed: alert annotations and the dashboards' own links point at them.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

from grafana_foundation_sdk.builders import bargauge as sdk_bargauge
from grafana_foundation_sdk.builders import common as sdk_common
from grafana_foundation_sdk.builders import dashboard as sdk
from grafana_foundation_sdk.builders import prometheus as sdk_prometheus
from grafana_foundation_sdk.builders import stat as sdk_stat
from grafana_foundation_sdk.builders import statetimeline as sdk_statetimeline
from grafana_foundation_sdk.builders import table as sdk_table
from grafana_foundation_sdk.builders import timeseries as sdk_timeseries
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as model
from grafana_foundation_sdk.models import prometheus as model_prometheus

from gpuguard.contract import RUNNING_PHASES

OUT_DIR = Path(__file__).resolve().parent / "dashboards"

DATASOURCE = model.DataSourceRef(type_val="prometheus", uid="${datasource}")
TAG = "gpuguard"

UID_NODE = "gpuguard-node"
UID_TASKS = "gpuguard-tasks"
UID_ACTUATOR = "gpuguard-actuator"
UID_CLUSTER = "gpuguard-cluster"

# Label filters from the template variables. All variables allow "All" as ".*", so every
# filter is a regex match.
NODE = 'node=~"$node"'
NODE_GPU = 'node=~"$node", gpu=~"$gpu"'
NODE_CONTAINER = 'node=~"$node", container=~"$container"'
NODE_GPU_CONTAINER = 'node=~"$node", gpu=~"$gpu", container=~"$container"'
INSTANCE = 'instance=~"$instance"'

# Task phases (docs/interfaces.md §5) as numbers for the state timeline; 0 = no task.
PHASES = tuple(str(p) for p in RUNNING_PHASES)
PHASE_COLORS = {
    "idle": "transparent",
    "starting": "blue",
    "input": "yellow",
    "computing": "green",
    "draining": "purple",
}

Json = dict[str, Any]

# Units of the node list's columns (the cluster dashboard).
TABLE_UNITS = (("free memory", "bytes"), ("float time", "s"), ("busy", "percentunit"))


# --- targets and variables ------------------------------------------------------------------


def target(
    expr: str, legend: str = "", *, instant: bool = False, table: bool = False
) -> sdk_prometheus.Dataquery:
    """One Prometheus query of a panel; ``refId`` is assigned by ``panel``."""
    query = (
        sdk_prometheus.Dataquery()
        .datasource(DATASOURCE)
        .editor_mode(model_prometheus.QueryEditorMode.CODE)
        .expr(expr)
        .legend_format(legend or "__auto")
    )
    query = query.instant() if instant else query.range()
    return query.format(model_prometheus.PromQueryFormat.TABLE) if table else query


def datasource_variable() -> sdk.DatasourceVariable:
    return (
        sdk.DatasourceVariable("datasource")
        .label("Data source")
        .type("prometheus")
        .hide(model.VariableHide.DONT_HIDE)
        .regex("")
    )


def query_variable(
    name: str, label: str, metric_selector: str, label_name: str
) -> sdk.QueryVariable:
    """A multi-value variable from ``label_values(selector, label)``; All means ``.*``."""
    definition = f"label_values({metric_selector}, {label_name})"
    return (
        sdk.QueryVariable(name)
        .label(label)
        .datasource(DATASOURCE)
        .query(
            {
                "qryType": 1,
                "query": definition,
                "refId": "PrometheusVariableQueryEditor-VariableQuery",
            }
        )
        .hide(model.VariableHide.DONT_HIDE)
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .refresh(model.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .regex("")
        .sort(model.VariableSort.NUMERICAL_ASC)
    )


def node_variable() -> sdk.QueryVariable:
    return query_variable("node", "Node", "gpuguard_exporter_build_info", "node")


def gpu_variable() -> sdk.QueryVariable:
    return query_variable("gpu", "GPU", f"gpuguard_gpu_info{{{NODE}}}", "gpu")


def container_variable() -> sdk.QueryVariable:
    selector = f"gpuguard_container_info{{{NODE}}}"
    return query_variable("container", "Container", selector, "container")


def instance_variable() -> sdk.QueryVariable:
    # Actuator metrics carry no node label (§8); Prometheus' target label tells them apart.
    return query_variable("instance", "Actuator", "gpuguard_actuator_exporter_up", "instance")


# --- panels ---------------------------------------------------------------------------------


# The SDK's panel builders share their generic options (title, unit, thresholds...) by
# generated copies, not by a base class.
AnyPanel = (
    sdk_timeseries.Panel
    | sdk_stat.Panel
    | sdk_bargauge.Panel
    | sdk_statetimeline.Panel
    | sdk_table.Panel
)
P = TypeVar(
    "P",
    sdk_timeseries.Panel,
    sdk_stat.Panel,
    sdk_bargauge.Panel,
    sdk_statetimeline.Panel,
    sdk_table.Panel,
)


def thresholds(*steps: tuple[float | None, str]) -> sdk.ThresholdsConfig:
    return (
        sdk.ThresholdsConfig()
        .mode(model.ThresholdsMode.ABSOLUTE)
        .steps([model.Threshold(value=value, color=color) for value, color in steps])
    )


def value_mappings(names: dict[int, tuple[str, str]]) -> list[model.ValueMapping]:
    """Map integer values to (text, colour)."""
    options = {
        str(value): model.ValueMappingResult(text=text, color=color, index=index)
        for index, (value, (text, color)) in enumerate(names.items())
    }
    return [model.ValueMap(options=options)]


def dashed(series: str) -> sdk.DashboardFieldConfigSourceOverrides:
    """Draw the series whose name matches the regex ``series`` as a dashed line, unfilled."""
    return (
        sdk.DashboardFieldConfigSourceOverrides()
        .matcher(model.MatcherConfig(id_val="byRegexp", options=series))
        .properties(
            [
                model.DynamicConfigValue(
                    id_val="custom.lineStyle", value={"dash": [10, 10], "fill": "dash"}
                ),
                model.DynamicConfigValue(id_val="custom.fillOpacity", value=0),
            ]
        )
    )


def column_unit(column: str, unit: str) -> sdk.DashboardFieldConfigSourceOverrides:
    return (
        sdk.DashboardFieldConfigSourceOverrides()
        .matcher(model.MatcherConfig(id_val="byName", options=column))
        .properties([model.DynamicConfigValue(id_val="unit", value=unit)])
    )


def panel(
    builder: P,
    title: str,
    targets: Sequence[sdk_prometheus.Dataquery],
    *,
    description: str,
    width: int = 12,
    height: int = 8,
    unit: str | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    steps: sdk.ThresholdsConfig | None = None,
    mappings: list[model.ValueMapping] | None = None,
    overrides: Sequence[Builder[model.DashboardFieldConfigSourceOverrides]] = (),
    color: model.FieldColorModeId = model.FieldColorModeId.PALETTE_CLASSIC,
) -> P:
    """What every panel has; its id and position are assigned by ``dashboard``."""
    # Value mappings name their colours, which the thresholds colour scheme shows.
    colors = model.FieldColorModeId.THRESHOLDS if mappings else color
    builder = (
        builder.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets([t.ref_id(chr(ord("A") + i)) for i, t in enumerate(targets)])
        .span(width)
        .height(height)
        .color_scheme(sdk.FieldColor().mode(colors))
        .thresholds(steps or thresholds((None, "green")))
        .mappings(mappings or [])
        .overrides(list(overrides))
    )
    if unit is not None:
        builder = builder.unit(unit)
    if minimum is not None:
        builder = builder.min(minimum)
    if maximum is not None:
        builder = builder.max(maximum)
    return builder


def legend(
    mode: common.LegendDisplayMode, calcs: list[str] | None = None
) -> sdk_common.VizLegendOptions:
    built = (
        sdk_common.VizLegendOptions()
        .display_mode(mode)
        .placement(common.LegendPlacement.BOTTOM)
        # The SDK's legend defaults to showLegend false, Grafana's to true.
        .show_legend(True)
    )
    return built.calcs(calcs) if calcs else built


def last_value() -> sdk_common.ReduceDataOptions:
    return sdk_common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def timeseries(
    title: str,
    targets: Sequence[sdk_prometheus.Dataquery],
    *,
    description: str,
    stacked: bool = False,
    bars: bool = False,
    threshold_line: bool = False,
    **kwargs: Any,
) -> sdk_timeseries.Panel:
    builder = (
        sdk_timeseries.Panel()
        .draw_style(common.GraphDrawStyle.BARS if bars else common.GraphDrawStyle.LINE)
        .fill_opacity(60 if stacked or bars else 10)
        .line_width(1)
        .show_points(common.VisibilityMode.NEVER)
        .span_nulls(False)
        .stacking(
            sdk_common.StackingConfig()
            .group("A")
            .mode(common.StackingMode.NORMAL if stacked else common.StackingMode.NONE)
        )
        .thresholds_style(
            sdk_common.GraphThresholdsStyleConfig().mode(
                common.GraphThresholdsStyleMode.LINE
                if threshold_line
                else common.GraphThresholdsStyleMode.OFF
            )
        )
        .legend(legend(common.LegendDisplayMode.TABLE, ["lastNotNull", "max"]))
        .tooltip(
            sdk_common.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.MULTI)
            .sort(common.SortOrder.DESCENDING)
        )
    )
    return panel(builder, title, targets, description=description, **kwargs)


def stat(
    title: str, expr: str, *, description: str, width: int = 4, **kwargs: Any
) -> sdk_stat.Panel:
    builder = (
        sdk_stat.Panel()
        .color_mode(common.BigValueColorMode.VALUE)
        .graph_mode(common.BigValueGraphMode.AREA)
        .justify_mode(common.BigValueJustifyMode.AUTO)
        .reduce_options(last_value())
        .text_mode(common.BigValueTextMode.AUTO)
    )
    return panel(
        builder,
        title,
        [target(expr)],
        description=description,
        width=width,
        height=4,
        color=model.FieldColorModeId.THRESHOLDS,
        **kwargs,
    )


def bargauge(
    title: str, expr: str, legend: str, *, description: str, **kwargs: Any
) -> sdk_bargauge.Panel:
    builder = (
        sdk_bargauge.Panel()
        .display_mode(common.BarGaugeDisplayMode.GRADIENT)
        .orientation(common.VizOrientation.HORIZONTAL)
        .reduce_options(last_value())
        .show_unfilled(True)
    )
    return panel(
        builder,
        title,
        [target(expr, legend)],
        description=description,
        color=model.FieldColorModeId.THRESHOLDS,
        **kwargs,
    )


def state_timeline(
    title: str,
    expr: str,
    legend_format: str,
    *,
    description: str,
    mappings: list[model.ValueMapping],
    **kwargs: Any,
) -> sdk_statetimeline.Panel:
    builder = (
        sdk_statetimeline.Panel()
        .align_value(common.TimelineValueAlignment.CENTER)
        .legend(legend(common.LegendDisplayMode.LIST))
        .merge_values(True)
        .row_height(0.8)
        .show_value(common.VisibilityMode.AUTO)
        # The SDK's tooltip sorts ascending unless told; Grafana's default is no sorting.
        .tooltip(
            sdk_common.VizTooltipOptions()
            .mode(common.TooltipDisplayMode.SINGLE)
            .sort(common.SortOrder.NONE)
        )
        .fill_opacity(80)
        .line_width(0)
    )
    return panel(
        builder,
        title,
        [target(expr, legend_format)],
        description=description,
        mappings=mappings,
        **kwargs,
    )


def table(
    title: str,
    targets: Sequence[sdk_prometheus.Dataquery],
    *,
    description: str,
    rename: dict[str, str] | None = None,
    sort_by: str | None = None,
    **kwargs: Any,
) -> sdk_table.Panel:
    """An instant-query table; several targets are merged on their common labels.

    ``rename`` names the value columns (``Value #A`` ...); ``sort_by`` sorts descending.
    """
    organize: Json = {"excludeByName": {"Time": True, "__name__": True, "job": True}}
    if rename:
        organize["renameByName"] = rename
    builder = (
        sdk_table.Panel()
        .cell_height(common.TableCellHeight.SM)
        .footer(sdk_common.TableFooterOptions().show(False))
        .show_header(True)
        .transformations(
            [
                model.DataTransformerConfig(id_val="merge", options={}),
                model.DataTransformerConfig(id_val="organize", options=organize),
            ]
        )
    )
    if sort_by is not None:
        builder = builder.sort_by(
            [sdk_common.TableSortByFieldState().display_name(sort_by).desc(True)]
        )
    return panel(builder, title, targets, description=description, **kwargs)


def row(title: str) -> sdk.Row:
    """An expanded row: the panels after it, up to the next row, belong to it."""
    # Row.with_panel would nest the panels and collapse the row (Grafana drops the panels
    # of an expanded row that nests them), so the panels follow it at the top level.
    return sdk.Row(title).collapsed(False)


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[sdk.QueryVariable],
    panels: Sequence[AnyPanel | sdk.Row],
) -> Json:
    """The dashboard as JSON; panels are numbered in order and laid out by the SDK, left to
    right in rows of 24 columns."""
    builder = (
        sdk.Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .tooltip(model.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .timezone("")
        .week_start("")
        .refresh("10s")
        .version(1)
        .annotation(
            sdk.AnnotationQuery()
            .name("Annotations & Alerts")
            .datasource(model.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
            .hide(True)
            .icon_color("rgba(0, 211, 255, 1)")
            .type("dashboard")
            .built_in(1)
        )
        .link(
            sdk.DashboardLink("gpuguard")
            .type(model.DashboardLinkType.DASHBOARDS)
            .as_dropdown(True)
            .icon("external link")
            .keep_time(True)
            .tags([TAG])
        )
        .with_variable(datasource_variable())
    )
    for variable in variables:
        builder = builder.with_variable(variable)
    for number, item in enumerate(panels, start=1):
        if isinstance(item, sdk.Row):
            builder = builder.with_row(item.id(number))
        else:
            builder = builder.with_panel(item.id(number))
    return to_json(builder.build())


# --- the dashboards -------------------------------------------------------------------------


# dcgm-exporter's series of one physical GPU (its UUID), with gpuguard's node and gpu: the
# GPU's own row of gpuguard_gpu_info (GPU_I_ID empty), so the join is one-to-one.
def by_gpuguard_gpu(dcgm_metric: str) -> str:
    return (
        f"max by (UUID) ({dcgm_metric}) * on (UUID) group_left (node, gpu) "
        f'max by (UUID, node, gpu) (gpuguard_gpu_info{{{NODE_GPU}, GPU_I_ID=""}})'
    )


# Each container's SM share on a GPU, with the GPU's UUID (and MIG instance) that every
# per-GPU gpuguard series carries.
CONTAINER_SHARE_BY_UUID = (
    "sum by (node, gpu, container, UUID, GPU_I_ID) "
    f"(gpuguard_container_gpu_sm_utilization_ratio{{{NODE_GPU_CONTAINER}}})"
)


def dcgm_exporter_row() -> list[AnyPanel | sdk.Row]:
    """gpuguard's per-container share beside dcgm-exporter's device health, joined by the
    GPU's UUID (docs/operator-reference.md, "Beside dcgm-exporter"); empty where
    dcgm-exporter is not scraped."""
    health = (
        "from dcgm-exporter (DCGM_FI_DEV_{}), joined to gpuguard's node and GPU by UUID "
        "through gpuguard_gpu_info. Empty unless dcgm-exporter is scraped by this Prometheus."
    )
    return [
        row("Beside dcgm-exporter (joined by GPU UUID)"),
        timeseries(
            "Container SM share by GPU UUID",
            [target(CONTAINER_SHARE_BY_UUID, "{{container}} on {{UUID}} {{GPU_I_ID}}")],
            description=(
                "Each container's SM share (per-process samples) on each GPU, with the GPU's "
                "UUID as dcgm-exporter labels it: the key of the panels beside it."
            ),
            unit="percentunit",
            minimum=0,
            width=12,
        ),
        timeseries(
            "Container power by SM share",
            [
                target(
                    f"{CONTAINER_SHARE_BY_UUID} "
                    "* on (UUID) group_left () max by (UUID) (DCGM_FI_DEV_POWER_USAGE)",
                    "{{container}} on {{node}} GPU {{gpu}}",
                )
            ],
            description=(
                "The GPU's power draw (dcgm-exporter) times each container's SM share "
                "(gpuguard): who the watts are for. An estimate: idle power is shared out "
                "too. Empty unless dcgm-exporter is scraped by this Prometheus."
            ),
            unit="watt",
            minimum=0,
            width=12,
        ),
        timeseries(
            "GPU temperature (dcgm-exporter)",
            [target(by_gpuguard_gpu("DCGM_FI_DEV_GPU_TEMP"), "{{node}} GPU {{gpu}}")],
            description="GPU temperature " + health.format("GPU_TEMP"),
            unit="celsius",
            width=8,
        ),
        timeseries(
            "GPU power (dcgm-exporter)",
            [target(by_gpuguard_gpu("DCGM_FI_DEV_POWER_USAGE"), "{{node}} GPU {{gpu}}")],
            description="GPU power draw " + health.format("POWER_USAGE"),
            unit="watt",
            minimum=0,
            width=8,
        ),
        timeseries(
            "Last Xid error (dcgm-exporter)",
            [target(by_gpuguard_gpu("DCGM_FI_DEV_XID_ERRORS"), "{{node}} GPU {{gpu}}")],
            description=(
                "The last Xid error code the driver logged for the GPU (0: none), "
                + health.format("XID_ERRORS")
            ),
            unit="none",
            width=8,
        ),
    ]


def node_dashboard() -> Json:
    panels: list[AnyPanel | sdk.Row] = [
        stat(
            "Active tasks",
            f"sum(gpuguard:gpu_tasks_active:count{{{NODE_GPU}}})",
            description="GPU tasks whose container is running (not paused).",
        ),
        stat(
            "Waiting tasks",
            f"sum(gpuguard:gpu_tasks_waiting:count{{{NODE_GPU}}})",
            description="GPU tasks held back: their container is paused by admission control.",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat(
            "Paused containers",
            f"sum(gpuguard_container_paused{{{NODE_CONTAINER}}})",
            description="Containers paused right now, as the exporter sees them.",
        ),
        stat(
            "Unattributed GPU processes",
            f"sum(gpuguard_unattributed_gpu_processes{{{NODE_GPU}}})",
            description="GPU processes in no container: they use the GPU but cannot be paused.",
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat(
            "Invalid deadline labels",
            f"sum(gpuguard_container_deadline_invalid{{{NODE_CONTAINER}}})",
            description="Containers whose gpuguard.deadline label does not parse.",
            steps=thresholds((None, "green"), (1, "red")),
        ),
        stat(
            "Exporter poll duration",
            f"max(gpuguard_exporter_poll_duration_seconds{{{NODE}}})",
            description="Duration of the exporter's last poll (GPU sample + join + tracker).",
            unit="s",
        ),
        timeseries(
            "GPU utilization",
            [target(f"gpuguard_gpu_utilization_ratio{{{NODE_GPU}}}", "{{node}} GPU {{gpu}}")],
            description=(
                "NVML device utilization: the share of time any kernel ran. A tiny kernel "
                "shows 100%; see SM utilization per container for who uses it."
            ),
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        timeseries(
            "GPU memory",
            [
                target(
                    f"gpuguard_gpu_memory_used_bytes{{{NODE_GPU}}}", "{{node}} GPU {{gpu}} used"
                ),
                target(
                    f"gpuguard_gpu_memory_total_bytes{{{NODE_GPU}}}", "{{node}} GPU {{gpu}} total"
                ),
            ],
            description="Device memory used against the device's total.",
            unit="bytes",
            minimum=0,
            overrides=[dashed(".* total")],
        ),
        timeseries(
            "GPU memory per container",
            [
                target(
                    "sum by (node, gpu, container) "
                    f"(gpuguard_container_gpu_memory_bytes{{{NODE_GPU_CONTAINER}}})",
                    "{{container}} ({{node}} GPU {{gpu}})",
                )
            ],
            description="Which containers share each GPU, stacked by the memory each one holds.",
            stacked=True,
            unit="bytes",
            minimum=0,
        ),
        timeseries(
            "SM utilization per container",
            [
                target(
                    "sum by (node, gpu, container) "
                    f"(gpuguard_container_gpu_sm_utilization_ratio{{{NODE_GPU_CONTAINER}}})",
                    "{{container}} ({{node}} GPU {{gpu}})",
                )
            ],
            description="Each container's share of SM time (NVML process utilization samples).",
            stacked=True,
            unit="percentunit",
            minimum=0,
        ),
        timeseries(
            "Active and waiting tasks",
            [
                target(
                    f"gpuguard:gpu_tasks_active:count{{{NODE_GPU}}}", "active {{node}} GPU {{gpu}}"
                ),
                target(
                    f"gpuguard:gpu_tasks_waiting:count{{{NODE_GPU}}}",
                    "waiting {{node}} GPU {{gpu}}",
                ),
            ],
            description=(
                "Admission control at work: tasks on the GPU against tasks whose container is "
                "paused until the GPU is free (recording rules)."
            ),
            minimum=0,
        ),
        timeseries(
            "Waiting queue (exporter)",
            [target(f"gpuguard_tasks_waiting{{{NODE_GPU}}}", "{{node}} GPU {{gpu}}")],
            description="Running tasks whose container is paused, straight from the exporter.",
            bars=True,
            minimum=0,
        ),
        table(
            "GPUs and MIG devices",
            [
                target(
                    "max by (node, gpu, name, uuid, UUID, GPU_I_PROFILE) "
                    f"(gpuguard_gpu_memory_total_bytes{{{NODE_GPU}}} * on (node, gpu) "
                    "group_left (name, uuid, GPU_I_PROFILE) "
                    f"gpuguard_gpu_info{{{NODE_GPU}}})",
                    instant=True,
                    table=True,
                )
            ],
            description=(
                "Every device and its memory. A MIG device is gpu <gpu>:<mig>, its own "
                "admission queue; NVML gives it no utilization and no per-process samples, so "
                "its tasks run from memory in use to memory freed. A GPU in MIG mode reports "
                "no memory of its own (its instances hold it all), so it is not listed; UUID "
                "and GPU_I_PROFILE are dcgm-exporter's labels for the same device."
            ),
            unit="bytes",
            width=24,
        ),
        table(
            "Containers sharing each GPU",
            [
                target(
                    f"gpuguard_container_gpu_processes{{{NODE_GPU_CONTAINER}}}",
                    instant=True,
                    table=True,
                )
            ],
            description="GPU processes per container and GPU, now.",
            width=24,
        ),
        *dcgm_exporter_row(),
    ]
    return dashboard(
        UID_NODE,
        "GPU node",
        "Per-GPU utilization and memory, the containers sharing each GPU, and the waiting queue.",
        [node_variable(), gpu_variable(), container_variable()],
        panels,
    )


def phase_expr() -> str:
    """One number per (node, gpu, container): the code of its task's phase, 0 when none."""
    parts = [
        f'gpuguard_container_task_phase{{{NODE_GPU_CONTAINER}, phase="{name}"}} * {code}'
        for code, name in enumerate(PHASES, start=1)
    ]
    return "max by (node, gpu, container) (" + " or ".join(parts) + ")"


def by_class(expr: str) -> str:
    """``expr`` per container with the container's priority class as a label."""
    return (
        f"sum by (node, container, class) ({expr} * on (node, container_id) group_left (class) "
        f"gpuguard_container_task_info{{{NODE_CONTAINER}}})"
    )


def class_panels() -> list[AnyPanel]:
    """What each container's tasks are, its class and demand; best-effort freezes and thaws."""
    return [
        table(
            "Task mode and class per container",
            [
                target(
                    "max by (node, container, task_mode, class) "
                    f"(gpuguard_container_task_info{{{NODE_CONTAINER}}})",
                    instant=True,
                    table=True,
                )
            ],
            description=(
                "What a task of each container is (gpuguard.task: process, memory, burst) and "
                "its class (gpuguard.class; real-time with a deadline, else normal): "
                "best-effort containers are frozen while real-time work needs their GPU."
            ),
            width=12,
        ),
        timeseries(
            "Demand (expected SM share)",
            [
                target(
                    "max by (node, container) "
                    f"(gpuguard_container_demand_sm_ratio{{{NODE_CONTAINER}}})",
                    "{{container}} ({{node}})",
                )
            ],
            description=(
                "The SM share each container's tasks take while computing, learnt from tasks "
                "that ran alone: admission by headroom runs tasks together while their shares "
                "fit (unknown: the whole GPU)."
            ),
            unit="percentunit",
            minimum=0,
            maximum=1,
            width=12,
        ),
        stat(
            "Best-effort containers frozen",
            f"sum(gpuguard_container_paused{{{NODE_CONTAINER}}} * on (node, container_id) "
            "group_left () gpuguard_container_task_info"
            f'{{{NODE_CONTAINER}, class="best-effort"}}) or vector(0)',
            description="Best-effort containers paused right now (real-time work has their GPU).",
            width=4,
        ),
        timeseries(
            "Time paused by class (best-effort: frozen)",
            [
                target(
                    by_class(
                        "rate(gpuguard_container_paused_seconds_total"
                        f"{{{NODE_CONTAINER}}}[$__rate_interval])"
                    ),
                    "{{container}} ({{class}})",
                )
            ],
            description=(
                "Share of time each container was paused. A best-effort one is frozen while a "
                "real-time task on its GPU runs or waits, and keeps at least "
                "--policy.best-effort-min-share of each window."
            ),
            unit="percentunit",
            minimum=0,
            maximum=1,
            width=10,
        ),
        timeseries(
            "Resumes by class (best-effort: thaws)",
            [
                target(
                    by_class(
                        "increase(gpuguard_container_resumes_total"
                        f"{{{NODE_CONTAINER}}}[$__rate_interval])"
                    ),
                    "{{container}} ({{class}})",
                )
            ],
            description="Times each container was resumed; for a best-effort one, its thaws.",
            bars=True,
            minimum=0,
            width=10,
        ),
    ]


def tasks_dashboard() -> Json:
    phase_names = {0: ("idle", PHASE_COLORS["idle"])}
    phase_names.update(
        {code: (name, PHASE_COLORS[name]) for code, name in enumerate(PHASES, start=1)}
    )
    panels: list[AnyPanel | sdk.Row] = [
        state_timeline(
            "Task phase per container",
            phase_expr(),
            "{{container}} ({{node}} GPU {{gpu}})",
            description=(
                "Life cycle of each container's GPU task: starting, input (memory grows, no SM "
                "activity), computing, draining."
            ),
            mappings=value_mappings(phase_names),
            width=24,
            height=9,
        ),
        timeseries(
            "Elapsed vs deadline",
            [
                target(
                    f"gpuguard_container_task_elapsed_seconds{{{NODE_GPU_CONTAINER}}}",
                    "{{container}} elapsed",
                ),
                target(
                    "max by (node, container) "
                    f"(gpuguard_container_deadline_seconds{{{NODE_CONTAINER}}})",
                    "{{container}} deadline",
                ),
            ],
            description="Run time of each container's oldest running task against its deadline.",
            unit="s",
            minimum=0,
            overrides=[dashed(".* deadline")],
        ),
        timeseries(
            "Slack",
            [
                target(
                    f"gpuguard_container_task_slack_seconds{{{NODE_GPU_CONTAINER}}}",
                    "{{container}} ({{node}} GPU {{gpu}})",
                )
            ],
            description="Deadline minus elapsed time of the running task; below 0 is an overrun.",
            unit="s",
            steps=thresholds((None, "red"), (0, "green")),
            threshold_line=True,
        ),
        bargauge(
            "Deadline hit ratio (5m)",
            f"gpuguard:container_deadline_hit_ratio:5m{{{NODE_CONTAINER}}}",
            "{{container}} ({{node}})",
            description="Share of tasks finished within their deadline over 5 minutes.",
            unit="percentunit",
            minimum=0,
            maximum=1,
            steps=thresholds((None, "red"), (0.9, "orange"), (0.99, "green")),
        ),
        timeseries(
            "Deadline hit ratio (1h)",
            [
                target(
                    f"gpuguard:container_deadline_hit_ratio:1h{{{NODE_CONTAINER}}}",
                    "{{container}} ({{node}})",
                )
            ],
            description="Share of tasks finished within their deadline over one hour.",
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        timeseries(
            "Latency SLO attainment",
            [
                target(
                    f"gpuguard:container_slo_attainment_ratio:{window}{{{NODE_CONTAINER}}}",
                    f"{{{{container}}}} ({{{{node}}}}) {window}",
                )
                for window in ("1m", "5m")
            ]
            + [
                target(
                    "max by (node, container) "
                    f"(gpuguard_container_slo_objective_ratio{{{NODE_CONTAINER}}})",
                    "{{container}} ({{node}}) objective",
                )
            ],
            description=(
                "Share of each container's requests within its SLO target (gpuguard.slo.*), "
                "from its own latency histogram, over 1 and 5 minutes, against its objective. "
                "Only containers that declare an SLO and serve requests."
            ),
            unit="percentunit",
            minimum=0,
            maximum=1,
            overrides=[dashed(".* objective")],
        ),
        timeseries(
            "Deadline misses",
            [
                target(
                    "sum by (node, container) (increase("
                    f"gpuguard_container_deadline_misses_total{{{NODE_CONTAINER}}}"
                    "[$__rate_interval]))",
                    "{{container}} ({{node}})",
                )
            ],
            description="Tasks that finished after their deadline.",
            bars=True,
            minimum=0,
        ),
        timeseries(
            "Tasks finished",
            [
                target(
                    "sum by (node, container) (increase("
                    f"gpuguard_container_tasks_finished_total{{{NODE_CONTAINER}}}"
                    "[$__rate_interval]))",
                    "{{container}} ({{node}})",
                )
            ],
            description="GPU tasks that ended, per container.",
            bars=True,
            minimum=0,
        ),
        timeseries(
            "Task run time",
            [
                target(
                    f"histogram_quantile({q}, sum by (le, node, gpu) (rate("
                    f"gpuguard_task_run_seconds_bucket{{{NODE_GPU}}}[$__rate_interval])))",
                    f"p{round(q * 100)} {{{{node}}}} GPU {{{{gpu}}}}",
                )
                for q in (0.5, 0.95)
            ],
            description="Quantiles of finished tasks' run time per GPU.",
            unit="s",
            minimum=0,
        ),
        *class_panels(),
        table(
            "Container deadlines",
            [
                target(
                    f"gpuguard_container_deadline_seconds{{{NODE_CONTAINER}}}",
                    instant=True,
                    table=True,
                )
            ],
            description="Relative deadline of each container (label gpuguard.deadline).",
            unit="s",
        ),
    ]
    return dashboard(
        UID_TASKS,
        "GPU tasks and deadlines",
        "Task phases, run time against deadlines, slack, misses and hit ratio per container.",
        [node_variable(), gpu_variable(), container_variable()],
        panels,
    )


def actuator_dashboard() -> Json:
    actions = f"gpuguard_actuator_actions_total{{{INSTANCE}}}"
    panels: list[AnyPanel | sdk.Row] = [
        stat(
            "Paused containers",
            f"sum(gpuguard_actuator_paused_containers{{{INSTANCE}}})",
            description="Containers the actuator holds paused now.",
            width=5,
        ),
        stat(
            "Fail-open events",
            f"sum(increase(gpuguard_actuator_fail_open_total{{{INSTANCE}}}[$__range]))",
            description=(
                "Times the actuator resumed everything it paused (exporter unreachable, stale "
                "state, resume_all alert) in the time range."
            ),
            width=5,
            steps=thresholds((None, "green"), (1, "red")),
        ),
        stat(
            "Exporter reachable",
            f"min(gpuguard_actuator_exporter_up{{{INSTANCE}}})",
            description="Whether the actuator can read fresh state from its exporter.",
            width=5,
            mappings=value_mappings({0: ("down", "red"), 1: ("up", "green")}),
        ),
        stat(
            "Unprovisionable nodes",
            f"sum(1 - gpuguard_actuator_node_provisionable{{{INSTANCE}}})",
            description="Nodes marked so that no new real-time container is placed there.",
            width=5,
            steps=thresholds((None, "green"), (1, "orange")),
        ),
        stat(
            "Guard lease age",
            f"max(gpuguard_actuator_guard_lease_age_seconds{{{INSTANCE}}})",
            description=(
                "Seconds since the guard (which resumes what the actuator paused if it dies) "
                "last renewed its lease; over 30 s: GpuguardGuardMissing."
            ),
            width=4,
            unit="s",
            steps=thresholds((None, "green"), (30, "red")),
        ),
        timeseries(
            "Pauses and resumes",
            [
                target(
                    'sum by (action) (increase(gpuguard_actuator_actions_total{action=~"pause|'
                    f'unpause", result=~"ok|dry_run", {INSTANCE}}}[$__rate_interval]))',
                    "{{action}}",
                )
            ],
            description="Containers paused and resumed (including dry-run decisions).",
            bars=True,
            minimum=0,
        ),
        timeseries(
            "Decision latency",
            [
                target(
                    f"histogram_quantile({q}, sum by (le, trigger) (rate("
                    f"gpuguard_actuator_decision_seconds_bucket{{{INSTANCE}}}[$__rate_interval])))",
                    f"p{round(q * 100)} {{{{trigger}}}}",
                )
                for q in (0.5, 0.95, 0.99)
            ],
            description="Time from trigger (webhook, fast path event, reconcile) to actions done.",
            unit="s",
            minimum=0,
        ),
        bargauge(
            "Actions by result",
            f"sum by (action, result) (increase({actions}[$__range]))",
            "{{action}} {{result}}",
            description="Actions in the time range, by outcome.",
            minimum=0,
        ),
        bargauge(
            "Skipped by reason",
            f"sum by (reason) (increase(gpuguard_actuator_skipped_total{{{INSTANCE}}}[$__range]))",
            "{{reason}}",
            description="Actions the actuator chose not to take, and why.",
            minimum=0,
        ),
        timeseries(
            "Paused containers: actuator vs exporter",
            [
                target(f"sum(gpuguard_actuator_paused_containers{{{INSTANCE}}})", "actuator"),
                target("sum(gpuguard_container_paused)", "exporter"),
            ],
            description=(
                "What the actuator believes it paused against what Docker reports; a lasting "
                "gap means something else paused or resumed containers."
            ),
            minimum=0,
        ),
        timeseries(
            "Webhooks by status code",
            [
                target(
                    "sum by (code) (increase("
                    f"gpuguard_actuator_webhooks_total{{{INSTANCE}}}[$__rate_interval]))",
                    "{{code}}",
                )
            ],
            description="Alertmanager deliveries; 5xx are retried by Alertmanager, 4xx are not.",
            bars=True,
            minimum=0,
        ),
    ]
    return dashboard(
        UID_ACTUATOR,
        "Actuator",
        "Admission control and node marking: actions, decision latency, skips and fail-open.",
        [instance_variable()],
        panels,
    )


def cluster_dashboard() -> Json:
    provisionable = f"max by (node) (gpuguard_actuator_node_provisionable{{{NODE}}})"
    panels: list[AnyPanel | sdk.Row] = [
        stat(
            "Nodes with an exporter",
            f"count(gpuguard_exporter_build_info{{{NODE}}})",
            description="Nodes with a gpuguard exporter.",
            width=6,
        ),
        stat(
            "GPUs",
            f"count(gpuguard_gpu_info{{{NODE}}})",
            description="GPUs seen by the exporters.",
            width=6,
        ),
        stat(
            "Waiting tasks",
            f"sum(gpuguard:gpu_tasks_waiting:count{{{NODE}}})",
            description="Tasks held back by admission control, all nodes.",
            width=6,
        ),
        stat(
            "Lowest guarantee ratio",
            f"min(gpuguard:node_deadline_guarantee_ratio:5m{{{NODE}}})",
            description="The worst node's share of deadlines met over 5 minutes.",
            width=6,
            unit="percentunit",
            steps=thresholds((None, "red"), (0.9, "orange"), (0.99, "green")),
        ),
        state_timeline(
            "Node provisionable",
            provisionable,
            "{{node}}",
            description=(
                "Whether new real-time containers may be placed on each node; the actuator "
                "marks a node while GpuguardNodeCannotGuaranteeDeadlines fires."
            ),
            mappings=value_mappings({0: ("marked", "red"), 1: ("provisionable", "green")}),
            width=24,
            height=6,
        ),
        table(
            "Node list (paper C's record)",
            [
                target(f"max by (node, gpu) ({metric}{{{NODE}}})", instant=True, table=True)
                for metric in (
                    "gpuguard_gpu_state",
                    "gpuguard_gpu_free_memory_bytes",
                    "gpuguard_gpu_float_time_seconds",
                    "gpuguard_gpu_running_tasks",
                    "gpuguard_gpu_busy_ratio",
                )
            ],
            description=(
                "Each GPU's node record, most free memory first (paper C's order): state 0 "
                "GPUs take no new real-time containers (see the reasons below); float time "
                "is the sum of its tasks' float times (empty or +Inf: no task with a "
                "deadline). `gpuguard nodes --placer.url URL` shows the placer's own ranking."
            ),
            rename={
                "Value #A": "state",
                "Value #B": "free memory",
                "Value #C": "float time",
                "Value #D": "tasks",
                "Value #E": "busy",
            },
            sort_by="free memory",
            overrides=[column_unit(name, unit) for name, unit in TABLE_UNITS],
            width=24,
        ),
        state_timeline(
            "Node state (paper C)",
            f"max by (node) (gpuguard_node_state{{{NODE}}})",
            "{{node}}",
            description=(
                "1 while a node may take new real-time containers; 0 when on every GPU more "
                "than 10% of the last 30 s of tasks missed, a kernel ran all the time, or "
                "memory is 95% full (GpuguardNodeInStateZero fires and the actuator labels the "
                "node)."
            ),
            mappings=value_mappings({0: ("state 0", "red"), 1: ("state 1", "green")}),
        ),
        state_timeline(
            "State 0 reasons",
            f"max by (node, gpu, reason) (gpuguard_gpu_state_reason{{{NODE}}})",
            "{{node}} GPU {{gpu}} {{reason}}",
            description="Which of paper C's conditions holds on each GPU.",
            mappings=value_mappings({0: ("no", "transparent"), 1: ("yes", "red")}),
        ),
        timeseries(
            "Deadline guarantee ratio per node (5m)",
            [target(f"gpuguard:node_deadline_guarantee_ratio:5m{{{NODE}}}", "{{node}}")],
            description="Share of finished tasks that met their deadline on each node.",
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        timeseries(
            "Minimum slack per node",
            [target(f"gpuguard:node_min_slack_seconds{{{NODE}}}", "{{node}}")],
            description="The least slack of any running task on each node; below 0 is overrun.",
            unit="s",
        ),
        state_timeline(
            "Exporter collectors",
            f"min by (node, source) (gpuguard_exporter_collector_success{{{NODE}}})",
            "{{node}} {{source}}",
            description="Per-source health of each exporter (gpu, docker, procfs).",
            mappings=value_mappings({0: ("failing", "red"), 1: ("ok", "green")}),
        ),
        state_timeline(
            "Exporter up (actuator view)",
            "min by (instance) (gpuguard_actuator_exporter_up)",
            "{{instance}}",
            description="Whether each node's actuator reads fresh state from its exporter.",
            mappings=value_mappings({0: ("down", "red"), 1: ("up", "green")}),
        ),
        timeseries(
            "Exporter poll age",
            [
                target(
                    f"time() - gpuguard_exporter_last_poll_timestamp_seconds{{{NODE}}}",
                    "{{node}}",
                )
            ],
            description="Seconds since each exporter's last poll; grows when an exporter hangs.",
            unit="s",
            minimum=0,
        ),
        bargauge(
            "GPU utilization per node",
            f"avg by (node) (gpuguard_gpu_utilization_ratio{{{NODE}}})",
            "{{node}}",
            description="Mean device utilization of each node's GPUs.",
            unit="percentunit",
            minimum=0,
            maximum=1,
        ),
        table(
            "Node summary",
            [
                target(provisionable, instant=True, table=True),
                target(
                    f"gpuguard:node_deadline_guarantee_ratio:5m{{{NODE}}}", instant=True, table=True
                ),
                target(f"gpuguard:node_min_slack_seconds{{{NODE}}}", instant=True, table=True),
                target(
                    f"max by (node, version, backend) (gpuguard_exporter_build_info{{{NODE}}})",
                    instant=True,
                    table=True,
                ),
            ],
            description=(
                "Per node: provisionable (A), guarantee ratio (B), minimum slack (C), exporter "
                "version and GPU backend (D)."
            ),
            width=24,
        ),
    ]
    return dashboard(
        UID_CLUSTER,
        "Cluster",
        "Which nodes can take new real-time containers, and how well each meets deadlines.",
        [node_variable()],
        panels,
    )


def to_json(board: model.Dashboard) -> Json:
    """The dashboard as plain JSON values, with what the SDK's schema lacks added."""
    result: Json = json.loads(json.dumps(board, cls=JSONEncoder))
    # Grafana shows a query variable's `definition` in its variable list and writes it on
    # save; the 11.2 schema the SDK is generated from has no such field.
    for variable in result["templating"]["list"]:
        if variable["type"] == "query":
            variable["definition"] = variable["query"]["query"]
    return result


def build_all() -> dict[str, Json]:
    """File name -> dashboard."""
    boards = [node_dashboard(), tasks_dashboard(), actuator_dashboard(), cluster_dashboard()]
    return {f"{board['uid']}.json": board for board in boards}


def render(board: Json) -> str:
    # Sorted keys: the file does not change when an SDK release reorders its fields.
    return json.dumps(board, indent=2, ensure_ascii=False, sort_keys=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="fail if committed JSON differs")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="output directory")
    args = parser.parse_args(argv)
    boards = build_all()
    if args.check:
        stale = [
            name
            for name, board in boards.items()
            if not (args.out / name).is_file() or (args.out / name).read_text() != render(board)
        ]
        extra = sorted(p.name for p in args.out.glob("*.json") if p.name not in boards)
        for name in stale + extra:
            print(f"grafana/dashboards/{name} is out of date: run python grafana/build.py")
        return 1 if stale or extra else 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, board in boards.items():
        (args.out / name).write_text(render(board))
    return 0


if __name__ == "__main__":
    sys.exit(main())
