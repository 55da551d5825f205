"""Status derivation from the Deployment and pods (pure), and the events it implies."""

from typing import Any

from infernetes.operator.status import (
    MESSAGE_MAX,
    derive_status,
    progress_only,
    same_status,
    transitions,
)

NOW = "2026-01-01T00:00:00Z"
LATER = "2026-01-01T00:05:00Z"


def deployment(
    ready: int = 0, replicas: int = 1, available: str = "False", generation: int = 1, **extra: Any
) -> dict:
    conditions = [
        {"type": "Available", "status": available, "reason": "MinimumReplicas", "message": "m"}
    ]
    conditions += extra.pop("conditions", [])
    return {
        "metadata": {"generation": generation},
        "status": {
            "observedGeneration": extra.pop("observed", generation),
            "replicas": replicas,
            "readyReplicas": ready,
            "availableReplicas": ready,
            "updatedReplicas": extra.pop("updated", replicas),
            "conditions": conditions,
        },
    }


def pod(
    name: str = "p-1",
    scheduled: bool = True,
    message: str = "",
    waiting: dict | None = None,
    last: dict | None = None,
) -> dict:
    conditions = [
        {"type": "PodScheduled", "status": "True"}
        if scheduled
        else {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message,
        }
    ]
    statuses = []
    if waiting is not None:
        statuses.append(
            {
                "name": "server",
                "state": {"waiting": waiting},
                "lastState": {"terminated": last or {}},
                "restartCount": 4,
            }
        )
    return {
        "metadata": {"name": name},
        "status": {"conditions": conditions, "containerStatuses": statuses},
    }


def conditions(status: dict) -> dict[str, dict]:
    return {c["type"]: c for c in status["conditions"]}


def derive(
    dep: dict | None,
    pods: list[dict],
    previous=None,
    desired: int = 1,
    now: str = NOW,
    generation: int = 3,
) -> dict:
    return derive_status(
        generation=generation,
        desired_replicas=desired,
        deployment=dep,
        pods=pods,
        previous=previous,
        now=now,
    )


def test_ready_when_deployment_available() -> None:
    status = derive(deployment(ready=1, available="True"), [pod()])
    c = conditions(status)
    assert c["Ready"]["status"] == "True"
    assert c["Available"]["status"] == "True"
    assert c["Scheduled"]["status"] == "True"
    assert c["Degraded"]["status"] == "False"
    assert c["Progressing"]["status"] == "False" and c["Progressing"]["reason"] == "RolloutComplete"
    assert all(cond["observedGeneration"] == 3 for cond in status["conditions"])
    assert status["readyReplicas"] == 1 and status["replicas"] == 1


def test_unschedulable_pod_reports_the_scheduler_message() -> None:
    message = "0/2 nodes are available: 2 Insufficient nvidia.com/gpu."
    c = conditions(derive(deployment(), [pod(scheduled=False, message=message)]))
    assert c["Scheduled"]["status"] == "False"
    assert c["Scheduled"]["reason"] == "Unschedulable"
    assert message in c["Scheduled"]["message"]
    assert c["Ready"]["status"] == "False" and c["Ready"]["reason"] == "Unschedulable"


def test_crash_loop_is_degraded_with_the_termination_message() -> None:
    waiting = {"reason": "CrashLoopBackOff", "message": "back-off 40s"}
    last = {"exitCode": 1, "message": "ValueError: --max-model-len 99999 exceeds the model's 2048"}
    c = conditions(derive(deployment(), [pod(waiting=waiting, last=last)]))
    assert c["Degraded"]["status"] == "True"
    assert c["Degraded"]["reason"] == "CrashLoopBackOff"
    assert "exceeds the model's 2048" in c["Degraded"]["message"]
    assert "exit code 1" in c["Degraded"]["message"]
    assert c["Ready"]["reason"] == "CrashLoopBackOff"


def test_progress_deadline_is_degraded() -> None:
    stuck = {
        "type": "Progressing",
        "status": "False",
        "reason": "ProgressDeadlineExceeded",
        "message": "too slow",
    }
    c = conditions(derive(deployment(conditions=[stuck]), [pod()]))
    assert c["Degraded"]["reason"] == "ProgressDeadlineExceeded"
    assert c["Progressing"]["status"] == "False"


def test_rollout_in_progress() -> None:
    c = conditions(
        derive(deployment(ready=1, available="True", replicas=2, updated=1), [pod()], desired=1)
    )
    assert c["Progressing"]["status"] == "True" and c["Progressing"]["reason"] == "RollingOut"
    c = conditions(derive(deployment(ready=1, available="True", generation=2, observed=1), [pod()]))
    assert c["Progressing"]["status"] == "True"
    assert c["Ready"]["status"] == "False"  # the Deployment has not seen the new spec yet


def test_missing_deployment() -> None:
    c = conditions(derive(None, []))
    assert c["Available"]["reason"] == "DeploymentMissing"
    assert c["Scheduled"]["status"] == "Unknown"
    assert c["Ready"]["status"] == "False"


def test_scaled_to_zero_is_ready() -> None:
    c = conditions(derive(deployment(ready=0, replicas=0, available="True"), [], desired=0))
    assert c["Ready"]["status"] == "True"


def test_transition_time_kept_while_status_unchanged() -> None:
    first = derive(deployment(), [pod()])
    second = derive(deployment(), [pod()], previous=first["conditions"], now=LATER)
    assert conditions(second)["Ready"]["lastTransitionTime"] == NOW
    third = derive(
        deployment(ready=1, available="True"), [pod()], previous=second["conditions"], now=LATER
    )
    assert conditions(third)["Ready"]["lastTransitionTime"] == LATER
    assert same_status(first, second)
    assert not same_status(second, third)


def test_transitions_emit_user_events() -> None:
    before = derive(deployment(), [pod()])
    unschedulable = derive(
        deployment(), [pod(scheduled=False, message="no GPUs")], previous=before["conditions"]
    )
    events = transitions(before["conditions"], unschedulable["conditions"])
    assert ("Warning", "Unschedulable") in [(kind, reason) for kind, reason, _ in events]
    ready = derive(
        deployment(ready=1, available="True"), [pod()], previous=unschedulable["conditions"]
    )
    assert [e[:2] for e in transitions(unschedulable["conditions"], ready["conditions"])] == [
        ("Normal", "Ready")
    ]
    assert transitions(ready["conditions"], ready["conditions"]) == []


def test_settings_without_effect_make_a_warning_condition() -> None:
    ignored = ["spec.engine.swapSpace: argument --swap-space 8.0 has no effect here: never swapped"]
    status = derive_status(
        generation=3,
        desired_replicas=1,
        deployment=deployment(),
        pods=[pod()],
        previous=None,
        now=NOW,
        ignored_settings=ignored,
    )
    c = conditions(status)["SettingsIgnored"]
    assert (c["status"], c["reason"], c["observedGeneration"]) == ("True", "NoEffect", 3)
    assert c["message"] == "1 engine setting(s) have no effect: " + ignored[0]
    quiet = conditions(derive(deployment(), [pod()]))["SettingsIgnored"]
    assert (quiet["status"], quiet["reason"]) == ("False", "AllSettingsTakeEffect")
    assert not same_status(status, derive(deployment(), [pod()]))


def test_a_long_list_of_ignored_settings_fits_a_condition_message() -> None:
    ignored = [f"spec.engineEnv.VLLM_X{i}: " + "x" * 500 for i in range(100)]
    status = derive_status(
        generation=1,
        desired_replicas=1,
        deployment=None,
        pods=[],
        previous=None,
        now=NOW,
        ignored_settings=ignored,
    )
    message = conditions(status)["SettingsIgnored"]["message"]
    assert len(message) == MESSAGE_MAX and message.endswith("...")


def test_a_reconcile_error_is_degraded_and_not_ready() -> None:
    error = ("ReconcileError", "applying Deployment x: spec.template.spec.affinity: Invalid value")
    status = derive_status(
        generation=4,
        desired_replicas=1,
        deployment=deployment(ready=1, available="True"),
        pods=[pod()],
        previous=None,
        now=NOW,
        reconcile_error=error,
    )
    c = conditions(status)
    assert (c["Degraded"]["status"], c["Degraded"]["reason"]) == ("True", "ReconcileError")
    assert c["Degraded"]["message"] == error[1]
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReconcileError")
    assert c["Available"]["status"] == "True"  # the old generation still serves
    assert ("Warning", "ReconcileError") in [e[:2] for e in transitions(None, status["conditions"])]


def test_a_missing_child_makes_ready_false_while_it_is_repaired() -> None:
    status = derive_status(
        generation=1,
        desired_replicas=1,
        deployment=deployment(ready=1, available="True"),
        pods=[pod()],
        previous=None,
        now=NOW,
        stale_children=["Service llama: missing"],
    )
    c = conditions(status)
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ChildrenStale")
    assert c["Ready"]["message"] == "Service llama: missing"
    assert (c["Progressing"]["status"], c["Progressing"]["reason"]) == ("True", "Repairing")


def test_a_second_repair_before_the_first_is_over_is_written_and_told_at_once() -> None:
    def repairing(stale: list[str], previous: Any = None) -> dict:
        return derive_status(
            generation=1,
            desired_replicas=1,
            deployment=deployment(ready=1, available="True"),
            pods=[pod()],
            previous=previous,
            now=NOW,
            stale_children=stale,
        )

    first = repairing(["Deployment llama: missing"])
    second = repairing(["Service llama: missing"], previous=first["conditions"])
    assert not progress_only(first, second)
    events = transitions(first["conditions"], second["conditions"])
    assert ("Warning", "Repairing", "re-applying Service llama: missing") in events
    assert transitions(second["conditions"], second["conditions"]) == []


def test_a_claim_the_replicas_cannot_share_is_a_condition_and_an_event() -> None:
    note = "spec.modelCache.claimName: PersistentVolumeClaim cache is ReadWriteOnce: ..."
    status = derive_status(
        generation=1,
        desired_replicas=3,
        deployment=deployment(),
        pods=[pod()],
        previous=None,
        now=NOW,
        unshared_claims=[note],
    )
    claims = conditions(status)["ClaimsShared"]
    assert (claims["status"], claims["reason"], claims["message"]) == (
        "False",
        "ReadWriteOnce",
        note,
    )
    assert ("Warning", "ReadWriteOnce") in [e[:2] for e in transitions(None, status["conditions"])]
    assert conditions(derive(deployment(), [pod()]))["ClaimsShared"]["status"] == "True"


def test_progress_only_is_how_far_a_rollout_has_got_and_nothing_a_user_waits_on() -> None:
    created = derive(deployment(), [])
    scheduled = derive(deployment(), [pod()], previous=created["conditions"])
    assert progress_only(created, scheduled)  # Scheduled Unknown -> True, counts
    scaled = derive(deployment(replicas=2), [pod(), pod("p-2")], previous=created["conditions"])
    assert progress_only(created, scaled)
    ready = derive(deployment(ready=1, available="True"), [pod()], previous=created["conditions"])
    assert not progress_only(scheduled, ready)  # Ready turned True
    stuck = derive(
        deployment(), [pod(scheduled=False, message="no GPUs")], previous=created["conditions"]
    )
    assert not progress_only(created, stuck)  # Scheduled False, Ready Unschedulable
    crashing = derive(deployment(), [pod(waiting={"reason": "CrashLoopBackOff"})])
    assert not progress_only(scheduled, crashing)  # Degraded
    assert not progress_only({}, created)  # the first status
    assert not progress_only(
        {**scheduled, "observedGeneration": 2}, {**scheduled, "observedGeneration": 3}
    )
    next_generation = derive(deployment(), [pod()], generation=4)
    assert not progress_only(scheduled, next_generation)
