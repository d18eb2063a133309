"""lm-evaluation-harness, unchanged: its local-completions model with `--batch_size 4` (a list of
prompts per request) on small tasks written here, of each request kind: multiple_choice and
loglikelihood_rolling (prompt scoring: echo with logprobs) and generate_until.
argv: BASE_URL MODEL TOKENIZER_DIR"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from checks import BASE_URL, EXTRA, MODEL, check, report

DOCS = [  # one batch of 4
    {"question": "Sky colour?", "choices": ["blue", "green", "red"], "answer": 0, "text": "The sky is blue today."},
    {"question": "Grass colour?", "choices": ["blue", "green"], "answer": 1, "text": "Grass grows green."},
    {"question": "One plus one?", "choices": ["two", "three"], "answer": 0, "text": "One and one make two."},
    {"question": "Snow colour?", "choices": ["white", "black"], "answer": 0, "text": "Snow falls white."},
]
COMMON = """dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
"""
TASKS = {
    "tiny_mc": """output_type: multiple_choice
doc_to_text: "{{question}}"
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
metric_list:
  - metric: acc
""",
    "tiny_rolling": """output_type: loglikelihood_rolling
doc_to_text: ""
doc_to_target: "{{text}}"
metric_list:
  - metric: word_perplexity
""",
    "tiny_gen": """output_type: generate_until
doc_to_text: "{{question}}"
doc_to_target: "{{choices[answer]}}"
generation_kwargs:
  until: ["\\n"]
  max_gen_toks: 4
  do_sample: false
metric_list:
  - metric: exact_match
""",
}
METRICS = {"tiny_mc": "acc,none", "tiny_rolling": "word_perplexity,none", "tiny_gen": "exact_match,none"}


@check
def local_completions_batch_of_4():
    folder = Path(tempfile.mkdtemp(prefix="lm-eval-tasks-"))
    data = folder / "docs.jsonl"
    data.write_text("".join(json.dumps(d) + "\n" for d in DOCS))
    for name, body in TASKS.items():
        (folder / f"{name}.yaml").write_text(f"task: {name}\n" + COMMON.format(data=data) + body)
    args = (
        f"model={MODEL},base_url={BASE_URL}/completions,tokenizer={EXTRA[0]},tokenizer_backend=huggingface,"
        "num_concurrent=1,max_retries=1,max_length=300"
    )
    out = folder / "results"
    cmd = [sys.executable, "-m", "lm_eval", "--model", "local-completions", "--model_args", args]
    cmd += ["--tasks", ",".join(TASKS), "--include_path", str(folder), "--batch_size", "4", "--output_path", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    [path] = out.rglob("results_*.json")
    results = json.loads(path.read_text())["results"]
    for task, metric in METRICS.items():
        value = results[task][metric]
        assert isinstance(value, float) and value == value, (task, results[task])  # a number, not NaN


report()
