"""Status of an InferenceService, derived from its Deployment and pods, and from the engine
settings the runtime accepts without effect (a pure function).

Conditions follow the Kubernetes API conventions: type/status/reason/message/observedGeneration,
with lastTransitionTime kept while a condition's status does not change.
"""

from collections.abc import Mapping, Sequence
from typing import Any

# Waiting reasons that mean the pod will not start without a change from the user.
STUCK_WAITING_REASONS = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
    }
)


def _condition(items: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any]:
    for item in items or ():
        if item.get("type") == kind:
            return item
    return {}


def _scheduled(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    live = [pod for pod in pods if not pod.get("metadata", {}).get("deletionTimestamp")]
    for pod in live:
        cond = _condition(pod.get("status", {}).get("conditions"), "PodScheduled")
        if cond.get("status") == "False":
            pod_name = pod.get("metadata", {}).get("name", "")
            return (
                "False",
                cond.get("reason") or "Unschedulable",
                f"pod {pod_name}: {cond.get('message', '')}".strip(),
            )
    if not live:
        return "Unknown", "NoPods", "no pods exist yet"
    return "True", "AllPodsScheduled", f"{len(live)} pod(s) scheduled"


def _crash(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str] | None:
    """(reason, message) of the first container stuck in a crash/pull loop."""
    for pod in pods:
        for status in pod.get("status", {}).get("containerStatuses") or ():
            waiting = (status.get("state") or {}).get("waiting") or {}
            reason = waiting.get("reason")
            if reason not in STUCK_WAITING_REASONS:
                continue
            terminated = (status.get("lastState") or {}).get("terminated") or {}
            detail = terminated.get("message") or waiting.get("message") or ""
            exit_code = terminated.get("exitCode")
            pod_name = pod.get("metadata", {}).get("name", "")
            head = f"pod {pod_name} container {status.get('name')}: {reason}"
            if exit_code is not None:
                head += f" (exit code {exit_code}, restarts {status.get('restartCount', 0)})"
            return reason, f"{head}: {detail.strip()}" if detail.strip() else head
    return None


# The API server's limit on a condition's message (the CRD's status schema says so too).
MESSAGE_MAX = 32768


def _settings_ignored(ignored: Sequence[str]) -> tuple[str, str, str]:
    """SettingsIgnored: True while spec.engine/engineEnv hold settings the runtime ignores."""
    if not ignored:
        return "False", "AllSettingsTakeEffect", "no engine setting is known to be without effect"
    message = f"{len(ignored)} engine setting(s) have no effect: " + "; ".join(ignored)
    if len(message) > MESSAGE_MAX:
        message = message[: MESSAGE_MAX - 3] + "..."
    return "True", "NoEffect", message


def derive_status(
    *,
    generation: int,
    desired_replicas: int,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[Mapping[str, Any]] | None,
    now: str,
    ignored_settings: Sequence[str] = (),
) -> dict[str, Any]:
    """`conditions`, `replicas` and `readyReplicas` for the InferenceService's status;
    `ignored_settings` are the notes of `engine_support.review_engine(spec).ignored`."""
    dep_status = (deployment or {}).get("status") or {}
    dep_conditions = dep_status.get("conditions")
    ready = int(dep_status.get("readyReplicas") or 0)
    updated = int(dep_status.get("updatedReplicas") or 0)
    available = int(dep_status.get("availableReplicas") or 0)
    total = int(dep_status.get("replicas") or 0)
    dep_generation = (deployment or {}).get("metadata", {}).get("generation", 0)
    dep_observed = int(dep_status.get("observedGeneration") or 0)

    scheduled = _scheduled(pods)
    crash = _crash(pods)
    progressing_cond = _condition(dep_conditions, "Progressing")
    deadline_exceeded = progressing_cond.get("reason") == "ProgressDeadlineExceeded"
    replica_failure = _condition(dep_conditions, "ReplicaFailure")

    if deployment is None:
        available_c = ("False", "DeploymentMissing", "the Deployment does not exist yet")
    else:
        cond = _condition(dep_conditions, "Available")
        available_c = (
            cond.get("status", "Unknown"),
            cond.get("reason") or "Unknown",
            cond.get("message") or f"{available}/{desired_replicas} replicas available",
        )

    if crash:
        degraded = ("True", crash[0], crash[1])
    elif deadline_exceeded:
        degraded = ("True", "ProgressDeadlineExceeded", progressing_cond.get("message", ""))
    elif replica_failure.get("status") == "True":
        degraded = (
            "True",
            replica_failure.get("reason") or "ReplicaFailure",
            replica_failure.get("message", ""),
        )
    else:
        degraded = ("False", "AsExpected", "no replica is failing")

    rolling = deployment is not None and (
        dep_observed < dep_generation
        or updated < desired_replicas
        or available < desired_replicas
        or total > updated
    )
    counts = f"{updated}/{desired_replicas} updated, {available}/{desired_replicas} available"
    if deployment is None:
        progressing = ("True", "Creating", "creating the Deployment")
    elif deadline_exceeded:
        progressing = ("False", "ProgressDeadlineExceeded", progressing_cond.get("message", ""))
    elif rolling:
        progressing = ("True", "RollingOut", counts)
    else:
        progressing = ("False", "RolloutComplete", counts)

    up_to_date = deployment is not None and dep_observed >= dep_generation
    if available_c[0] == "True" and up_to_date and (ready > 0 or desired_replicas == 0):
        ready_c = ("True", "Ready", f"{ready}/{desired_replicas} replicas ready")
    elif scheduled[0] == "False":
        ready_c = ("False", "Unschedulable", scheduled[2])
    elif degraded[0] == "True":
        ready_c = ("False", degraded[1], degraded[2])
    else:
        ready_c = ("False", "NotReady", f"{ready}/{desired_replicas} replicas ready")

    computed = {
        "Ready": ready_c,
        "Available": available_c,
        "Progressing": progressing,
        "Degraded": degraded,
        "Scheduled": scheduled,
        "SettingsIgnored": _settings_ignored(ignored_settings),
    }
    conditions = []
    for kind, (status, reason, message) in computed.items():
        old = _condition(previous, kind)
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "observedGeneration": generation,
                "lastTransitionTime": old.get("lastTransitionTime")
                if old.get("status") == status and old.get("lastTransitionTime")
                else now,
            }
        )
    return {"conditions": conditions, "replicas": total, "readyReplicas": ready}


def transitions(
    previous: Sequence[Mapping[str, Any]] | None, current: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for the changes a user should hear about."""
    events = []
    for cond in current:
        old = _condition(previous, cond["type"])
        if old.get("status") == cond["status"] and old.get("reason") == cond["reason"]:
            continue
        kind, status = cond["type"], cond["status"]
        if kind == "Ready" and status == "True":
            events.append(("Normal", "Ready", cond["message"]))
        elif (kind == "Scheduled" and status == "False") or (
            kind == "Degraded" and status == "True"
        ):
            events.append(("Warning", cond["reason"], cond["message"]))
    return events


def same_status(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when writing `new` would change nothing a user sees (ignores transition times)."""

    def strip(status: Mapping[str, Any]) -> tuple:
        conds = tuple(
            sorted(
                (
                    c.get("type"),
                    c.get("status"),
                    c.get("reason"),
                    c.get("message"),
                    c.get("observedGeneration"),
                )
                for c in status.get("conditions") or ()
            )
        )
        return conds, status.get("replicas"), status.get("readyReplicas")

    return strip(current) == strip(new)
