"""Status of an InferenceService, derived from its Deployment and pods, and from the engine
settings the runtime accepts without effect (a pure function).

Conditions follow the Kubernetes API conventions: type/status/reason/message/observedGeneration,
with lastTransitionTime kept while a condition's status does not change.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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


def condition_of(items: Sequence[Mapping[str, Any]] | None, kind: str) -> Mapping[str, Any]:
    for item in items or ():
        if item.get("type") == kind:
            return item
    return {}


def _scheduled(pods: Sequence[Mapping[str, Any]]) -> tuple[str, str, str]:
    live = [pod for pod in pods if not pod.get("metadata", {}).get("deletionTimestamp")]
    for pod in live:
        cond = condition_of(pod.get("status", {}).get("conditions"), "PodScheduled")
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
    return (
        "True",
        "NoEffect",
        f"{len(ignored)} engine setting(s) have no effect: " + "; ".join(ignored),
    )


def claims_shared_condition(unshared: Sequence[str]) -> tuple[str, str, str]:
    """ClaimsShared: False while several replicas mount a claim that only one node (or one pod)
    can attach, so all but the replicas on that node stay Pending."""
    if not unshared:
        return "True", "Shareable", "the replicas can mount every claim they use"
    return "False", "ReadWriteOnce", "; ".join(unshared)


def _fit(message: str) -> str:
    return message if len(message) <= MESSAGE_MAX else message[: MESSAGE_MAX - 3] + "..."


@dataclass(frozen=True)
class Observed:
    """What one reconcile saw, the input of every condition."""

    desired_replicas: int
    deployment: Mapping[str, Any] | None
    pods: Sequence[Mapping[str, Any]]
    # (reason, message) when the spec could not be rendered or a child could not be applied.
    reconcile_error: tuple[str, str] | None = None
    # Children found missing or changed by someone else, "Service llama: missing" (being repaired).
    stale_children: Sequence[str] = ()

    @property
    def dep_status(self) -> Mapping[str, Any]:
        return (self.deployment or {}).get("status") or {}

    def count(self, field: str) -> int:
        return int(self.dep_status.get(field) or 0)

    def dep_condition(self, kind: str) -> Mapping[str, Any]:
        return condition_of(self.dep_status.get("conditions"), kind)

    @property
    def deployment_current(self) -> bool:
        """The Deployment controller has seen the Deployment's latest spec."""
        generation = (self.deployment or {}).get("metadata", {}).get("generation", 0)
        return self.deployment is not None and self.count("observedGeneration") >= generation

    @property
    def deadline_exceeded(self) -> bool:
        return self.dep_condition("Progressing").get("reason") == "ProgressDeadlineExceeded"


Verdict = tuple[str, str, str]  # status, reason, message


def available_condition(seen: Observed) -> Verdict:
    if seen.deployment is None:
        return "False", "DeploymentMissing", "the Deployment does not exist"
    cond = seen.dep_condition("Available")
    return (
        cond.get("status", "Unknown"),
        cond.get("reason") or "Unknown",
        cond.get("message")
        or f"{seen.count('availableReplicas')}/{seen.desired_replicas} replicas available",
    )


def degraded_condition(seen: Observed) -> Verdict:
    if seen.reconcile_error:
        return "True", *seen.reconcile_error
    crash = _crash(seen.pods)
    if crash:
        return "True", crash[0], crash[1]
    if seen.deadline_exceeded:
        return (
            "True",
            "ProgressDeadlineExceeded",
            seen.dep_condition("Progressing").get("message", ""),
        )
    failure = seen.dep_condition("ReplicaFailure")
    if failure.get("status") == "True":
        return "True", failure.get("reason") or "ReplicaFailure", failure.get("message", "")
    return "False", "AsExpected", "no replica is failing"


def progressing_condition(seen: Observed) -> Verdict:
    desired = seen.desired_replicas
    updated, available = seen.count("updatedReplicas"), seen.count("availableReplicas")
    counts = f"{updated}/{desired} updated, {available}/{desired} available"
    if seen.stale_children:
        return "True", "Repairing", "re-applying " + "; ".join(seen.stale_children)
    if seen.deployment is None:
        return "True", "Creating", "creating the Deployment"
    if seen.deadline_exceeded:
        return (
            "False",
            "ProgressDeadlineExceeded",
            seen.dep_condition("Progressing").get("message", ""),
        )
    rolling = (
        not seen.deployment_current
        or updated < desired
        or available < desired
        or seen.count("replicas") > updated
    )
    return ("True", "RollingOut", counts) if rolling else ("False", "RolloutComplete", counts)


def ready_condition(
    seen: Observed, available: Verdict, scheduled: Verdict, degraded: Verdict
) -> Verdict:
    ready, desired = seen.count("readyReplicas"), seen.desired_replicas
    if seen.reconcile_error:
        return "False", *seen.reconcile_error
    if seen.stale_children:
        return "False", "ChildrenStale", "; ".join(seen.stale_children)
    if available[0] == "True" and seen.deployment_current and (ready > 0 or desired == 0):
        return "True", "Ready", f"{ready}/{desired} replicas ready"
    if scheduled[0] == "False":
        return "False", "Unschedulable", scheduled[2]
    if degraded[0] == "True":
        return "False", degraded[1], degraded[2]
    return "False", "NotReady", f"{ready}/{desired} replicas ready"


# The autoscaler's own conditions that, when False, mean it is not scaling (the HPA controller's;
# KEDA's Ready).
AUTOSCALER_HEALTH = {
    "HorizontalPodAutoscaler": ("AbleToScale", "ScalingActive"),
    "ScaledObject": ("Ready",),
}


def autoscaling_condition(
    rendered: Verdict | None, autoscaler: Mapping[str, Any] | None
) -> Verdict | None:
    """Autoscaling: the render's verdict, made False with the autoscaler's own reason while the
    live HPA or ScaledObject reports it cannot scale (no custom-metrics API, a failing query)."""
    if rendered is None or rendered[0] != "True" or autoscaler is None:
        return rendered
    kind, name = autoscaler["kind"], autoscaler["metadata"]["name"]
    conditions = (autoscaler.get("status") or {}).get("conditions")
    for kind_of_condition in AUTOSCALER_HEALTH.get(kind, ()):
        found = condition_of(conditions, kind_of_condition)
        if found.get("status") == "False":
            reason = found.get("reason") or f"Not{kind_of_condition}"
            return "False", reason, f"{kind} {name}: {found.get('message', '')}".strip()
    return rendered


def derive_status(
    *,
    generation: int,
    desired_replicas: int,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[Mapping[str, Any]] | None,
    now: str,
    ignored_settings: Sequence[str] = (),
    reconcile_error: tuple[str, str] | None = None,
    stale_children: Sequence[str] = (),
    unshared_claims: Sequence[str] = (),
    autoscaling: Verdict | None = None,
    autoscaler: Mapping[str, Any] | None = None,
    rendered: Mapping[str, Verdict] | None = None,
) -> dict[str, Any]:
    """`conditions`, `replicas` and `readyReplicas` for the InferenceService's status;
    `ignored_settings` are the notes of `engine_support.review_engine(spec).ignored`;
    `reconcile_error` is why this generation could not be applied, `stale_children` what is
    being repaired (each makes Ready False); `unshared_claims` the claims several replicas
    cannot mount together; `autoscaling` the Autoscaling condition (only with spec.autoscaling:
    render.autoscaling says which autoscaler, or why none) and `autoscaler` the live HPA or
    ScaledObject, whose own conditions may say it cannot scale; `rendered` the conditions the
    render alone decides (render.Plan.conditions: Routing)."""
    seen = Observed(desired_replicas, deployment, pods, reconcile_error, tuple(stale_children))
    available = available_condition(seen)
    scheduled = _scheduled(pods)
    degraded = degraded_condition(seen)
    computed = {
        "Ready": ready_condition(seen, available, scheduled, degraded),
        "Available": available,
        "Progressing": progressing_condition(seen),
        "Degraded": degraded,
        "Scheduled": scheduled,
        "SettingsIgnored": _settings_ignored(ignored_settings),
        "ClaimsShared": claims_shared_condition(unshared_claims),
    }
    verdict = autoscaling_condition(autoscaling, autoscaler)
    if verdict is not None:
        computed["Autoscaling"] = verdict
    computed.update(rendered or {})
    return {
        "conditions": _conditions(computed, previous, generation, now),
        "replicas": seen.count("replicas"),
        "readyReplicas": seen.count("readyReplicas"),
    }


def role_status(
    *,
    generation: int,
    desired_replicas: int,
    deployment: Mapping[str, Any] | None,
    pods: Sequence[Mapping[str, Any]],
    previous: Sequence[Mapping[str, Any]] | None,
    now: str,
) -> dict[str, Any]:
    """The status of a role beside the serving one (status.prefill): its replicas and its own
    Ready, Available, Progressing and Degraded, read from its Deployment and pods as the
    resource's are. The resource's Ready stays the serving role's: without a prefill pod the
    decode engines compute prompts themselves."""
    seen = Observed(desired_replicas, deployment, pods)
    available = available_condition(seen)
    degraded = degraded_condition(seen)
    computed = {
        "Ready": ready_condition(seen, available, _scheduled(pods), degraded),
        "Available": available,
        "Progressing": progressing_condition(seen),
        "Degraded": degraded,
    }
    return {
        "conditions": _conditions(computed, previous, generation, now),
        "replicas": seen.count("replicas"),
        "readyReplicas": seen.count("readyReplicas"),
    }


def _conditions(
    computed: Mapping[str, Verdict],
    previous: Sequence[Mapping[str, Any]] | None,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """Conditions as written: a transition time kept while a condition's status holds."""
    conditions = []
    for kind, (status, reason, message) in computed.items():
        old = condition_of(previous, kind)
        conditions.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": _fit(message),
                "observedGeneration": generation,
                "lastTransitionTime": old.get("lastTransitionTime")
                if old.get("status") == status and old.get("lastTransitionTime")
                else now,
            }
        )
    return conditions


def _another_repair(old: Mapping[str, Any], cond: Mapping[str, Any]) -> bool:
    """A repair of other children while the last one is still on the status (someone deleted a
    second child before the first was back): a repair of its own, told and written at once."""
    return (
        cond["type"] == "Progressing"
        and cond["reason"] == "Repairing"
        and old.get("reason") == "Repairing"
        and old.get("message") != cond["message"]
    )


def transitions(
    previous: Sequence[Mapping[str, Any]] | None, current: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for the changes a user should hear about."""
    events = []
    for cond in current:
        old = condition_of(previous, cond["type"])
        same = old.get("status") == cond["status"] and old.get("reason") == cond["reason"]
        if same and not _another_repair(old, cond):
            continue
        kind, status = cond["type"], cond["status"]
        if kind == "Ready" and status == "True":
            events.append(("Normal", "Ready", cond["message"]))
        elif (
            (kind == "Scheduled" and status == "False")
            or (kind == "Degraded" and status == "True")
            or (kind == "Progressing" and cond["reason"] == "Repairing")
            or (kind == "ClaimsShared" and status == "False")
            or (kind in ("Autoscaling", "Routing") and status == "False")
            or (kind == "ModelCached" and cond["reason"] == "DownloadFailed")
        ):
            events.append(("Warning", cond["reason"], cond["message"]))
    return events


# Conditions whose moving on (a pod scheduled, a replica available) is how far a rollout has got,
# not a verdict a user or a tool waits on.
PROGRESS_CONDITIONS = frozenset({"Progressing", "Available", "Scheduled"})
# `replicas` is also the scale subresource's status, which autoscalers read: a few seconds late
# is within what they expect (an HPA looks every 15 s; the Deployment's own count lags its pods).
COUNTS = ("replicas", "readyReplicas")


def progress_only(current: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """True when `new` differs from `current` only in how far a rollout has got: replica
    counts, messages, Progressing/Available/Scheduled moving on (not Scheduled turning False).
    Such a change can wait a moment and be written with the next one; Ready, Degraded, a new
    generation, an error or a warning cannot."""
    if not current.get("conditions"):
        return False
    if any(
        current.get(field) != value
        for field, value in new.items()
        if field not in COUNTS and field != "conditions"
    ):
        return False
    for cond in new["conditions"]:
        old = condition_of(current.get("conditions"), cond["type"])
        if not old or old.get("observedGeneration") != cond["observedGeneration"]:
            return False
        if _another_repair(old, cond):
            return False
        if (old.get("status"), old.get("reason")) == (cond["status"], cond["reason"]):
            continue
        if cond["type"] not in PROGRESS_CONDITIONS or (
            cond["type"] == "Scheduled" and cond["status"] == "False"
        ):
            return False
    return True


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
