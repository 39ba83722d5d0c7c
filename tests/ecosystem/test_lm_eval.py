"""lm-evaluation-harness (`lm-eval` from PyPI) scores a multiple-choice task through radixkv's
/v1/completions (`local-completions`: token-id prompts, `echo`, prompt log-probs) exactly as its
`hf` model scores it on the same weights in-process."""

import json
import math

import pytest

lm_eval = pytest.importorskip("lm_eval", reason="lm-eval is a test extra: pip install 'lm-eval[api]==0.4.13'")

QUESTIONS = [
    ("The capital of France is", [" Paris", " Rome", " Berlin"], 0),
    ("The capital of Italy is", [" Madrid", " Rome", " Paris"], 1),
    ("Water freezes at zero degrees", [" Celsius", " Fahrenheit", " Kelvin"], 0),
    ("The sun rises in the", [" west", " north", " east"], 2),
    ("A week has seven", [" days", " months", " years"], 0),
    ("Cats are often kept as", [" tractors", " pets", " clouds"], 1),
    ("The opposite of hot is", [" cold", " loud", " blue"], 0),
    ("Two plus two equals", [" five", " three", " four"], 2),
]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("lm_eval_task")
    with open(d / "questions.jsonl", "w") as f:
        f.writelines(json.dumps({"question": q, "choices": choices, "answer": answer}) + "\n" for q, choices, answer in QUESTIONS)
    (d / "radixkv_mc.yaml").write_text(f"""task: radixkv_mc
dataset_path: json
dataset_kwargs:
  data_files:
    test: {d / 'questions.jsonl'}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: "{{{{answer}}}}"
target_delimiter: ""
metric_list:
  - metric: acc
""")
    return d


def evaluate(model, task_dir):
    from lm_eval import simple_evaluate
    from lm_eval.tasks import TaskManager

    out = simple_evaluate(model=model, tasks=["radixkv_mc"], task_manager=TaskManager(include_path=str(task_dir)),
                          log_samples=True, batch_size=1, random_seed=0, numpy_random_seed=0, torch_random_seed=0,
                          fewshot_random_seed=0)
    samples = sorted(out["samples"]["radixkv_mc"], key=lambda s: s["doc_id"])
    return out["results"]["radixkv_mc"]["acc,none"], [[r[0][0] for r in s["resps"]] for s in samples]


def test_local_completions_scores_like_the_hf_model(server, task_dir, monkeypatch):
    from lm_eval.models.huggingface import HFLM

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("OPENAI_API_KEY", server.api_key)
    model_dir = server.info()["model_dir"]
    remote = lm_eval.api.registry.get_model("local-completions")(
        model="SmolLM2-135M-Instruct", base_url=f"{server.url}/v1/completions", tokenizer=model_dir,
        tokenized_requests=True, num_concurrent=1, max_retries=1, batch_size=1)
    acc_remote, ll_remote = evaluate(remote, task_dir)
    local = HFLM(pretrained=model_dir, device="cpu", dtype="float32", batch_size=1)
    acc_local, ll_local = evaluate(local, task_dir)
    assert acc_remote == acc_local and acc_local >= 0.5
    for a, b in zip(ll_remote, ll_local):  # every choice's log-likelihood, not only the argmax
        assert all(math.isclose(x, y, abs_tol=2e-3) for x, y in zip(a, b)), (a, b)
