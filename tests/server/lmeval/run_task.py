"""Runs a local lm-eval task against a server with ``local-completions`` and
``tokenizer_backend=remote``, under lm-eval's own environment (see requirements.txt here), and
writes what the test compares as JSON: the accuracy and each sample's question and choice scores.

Usage: run_task.py BASE_URL MODEL TASK_FOLDER TASK_NAME OUTPUT_JSON
"""

import json
import sys

import lm_eval
from lm_eval.tasks import TaskManager


def main(base_url: str, model: str, task_folder: str, task: str, output: str) -> None:
    results = lm_eval.simple_evaluate(
        model="local-completions",
        model_args=(
            f"base_url={base_url}/v1/completions,model={model},tokenizer_backend=remote,"
            "num_concurrent=1,max_retries=1,tokenized_requests=True"
        ),
        tasks=[task],
        task_manager=TaskManager(include_path=task_folder),
        log_samples=True,
    )
    samples = [
        {"question": s["doc"]["question"], "scores": [r[0] for r in s["filtered_resps"]]}
        for s in results["samples"][task]
    ]
    with open(output, "w") as handle:
        json.dump({"acc": results["results"][task]["acc,none"], "samples": samples}, handle)


if __name__ == "__main__":
    main(*sys.argv[1:])
