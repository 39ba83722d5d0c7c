"""LoRA adapters on the real server with the default model (SmolLM2-135M-Instruct, random PEFT
adapters): each row of a batch mixing adapters gets transformers' greedy tokens with its adapter
merged; the OpenAI client picks an adapter by `model`; /v1/models lists them; adapters load and
unload at run time, with clear errors; each adapter caches apart; only the admin key may load."""

import pytest

pytest.importorskip("peft")

from tests.lora.helpers import make_adapter, merged_greedy  # noqa: E402
from tests.server_helpers import API_KEY, start_server, stop_server  # noqa: E402


def as_admin(server):
    client = server.client()
    client.headers["Authorization"] = f"Bearer {ADMIN}"
    return client

pytestmark = pytest.mark.timeout(600)
MODEL = "SmolLM2-135M-Instruct"
N = 8
OTHER, ADMIN = "second-tenant-key", "lora-admin-key"


@pytest.fixture(scope="module")
def lora_server(tmp_path_factory):
    from radixkv.model.gguf import default_model_dir

    base = default_model_dir()
    root = tmp_path_factory.mktemp("adapters")
    a = make_adapter(base, root / "a", seed=11, rank=8, scale=4.0)
    b = make_adapter(base, root / "b", seed=12, rank=4, targets=["q_proj", "v_proj", "o_proj"], scale=4.0)
    c = make_adapter(base, root / "c", seed=13, rank=4, scale=4.0)
    server = start_server("--lora-paths", f"a={a}", f"b={b}", "--max-lora-rank", "8", "--admin-key", ADMIN,
                          extra_keys=(OTHER,))
    yield server, base, {"a": a, "b": b, "c": c}
    stop_server(server)


def prompt_ids(server, text):
    with server.client() as c:
        return c.post("/tokenize", json={"prompt": text}).json()["tokens"]


def test_a_batch_mixing_adapters_gives_each_row_its_merged_models_tokens(lora_server):
    server, base, dirs = lora_server
    p0 = prompt_ids(server, "The old lighthouse keeper said")
    p1 = prompt_ids(server, "A recipe for bread starts with")
    prompts, loras = [p0, p0, p1, p1], ["a", "b", None, "a"]
    with server.client() as c:
        r = c.post("/generate", json={"input_ids": prompts, "lora_path": loras,
                                      "sampling_params": {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}})
    assert r.status_code == 200, r.text
    got = [o["output_ids"] for o in r.json()]
    for ids, name, out in zip(prompts, loras, got):
        assert out == merged_greedy(base, dirs.get(name), ids, N), name
    assert got[0] != got[1]  # the adapters change the tokens


def test_the_openai_client_names_an_adapter_by_model(lora_server):
    openai = pytest.importorskip("openai")
    server, _, _ = lora_server
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=API_KEY)
    models = {m.id: m for m in client.models.list().data}
    assert set(models) == {MODEL, "a", "b"} and models["a"].parent == MODEL
    ids = prompt_ids(server, "Once upon a time")
    with server.client() as c:
        native = c.post("/generate", json={"input_ids": ids, "lora_path": "a",
                                           "sampling_params": {"max_new_tokens": N, "temperature": 0}}).json()["text"]
    for name in ("a", f"{MODEL}:a"):  # by its name, or SGLang's BASE:ADAPTER
        out = client.completions.create(model=name, prompt=ids, max_tokens=N, temperature=0)
        assert out.choices[0].text == native
    chat = client.chat.completions.create(model="b", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                          temperature=0)
    assert chat.choices[0].message.content
    with pytest.raises(openai.NotFoundError, match="zzz"):
        client.completions.create(model="zzz", prompt="x", max_tokens=1)
    with server.client() as c:
        r = c.post("/generate", json={"text": "x", "lora_path": "zzz"})
        assert r.status_code == 400 and "lora_path='zzz'" in r.json()["error"]["message"]
        r = c.post("/v1/responses", json={"model": "a", "input": "x"})
        assert r.status_code == 400 and "LoRA adapter" in r.json()["error"]["message"]


def test_each_adapter_caches_apart(lora_server):
    server, _, _ = lora_server
    text = "Write three facts about the moon, each in one sentence, numbered. " * 3

    def cached(lora):
        with server.client() as c:
            body = {"text": text, "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
            if lora:
                body["lora_path"] = lora
            return c.post("/generate", json=body).json()["meta_info"]["cached_tokens"]

    assert cached("a") == 0
    assert cached("b") == 0 and cached(None) == 0  # the same prompt, another adapter or the base: a miss
    assert cached("a") > 20
    rows = {r["name"]: r for r in server.info()["stats"]["lora_adapters"]}  # per-adapter hit rates
    assert rows["a"]["cached_tokens"] > 20 and 0 < rows["a"]["hit_rate"] < 1 and rows["b"]["requests"] >= 1
    with server.client() as c:
        assert 'radixkv_lora_hit_rate{adapter="a"}' in c.get("/metrics").text


def test_adapters_load_and_unload_at_run_time(lora_server, tmp_path):
    server, base, dirs = lora_server
    with as_admin(server) as c:
        r = c.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": str(dirs["c"])})
        assert r.status_code == 200 and r.json()["adapters"] == ["a", "b", "c"], r.text
        ids = prompt_ids(server, "The river")
        out = c.post("/generate", json={"input_ids": ids, "lora_path": "c",
                                         "sampling_params": {"max_new_tokens": N, "temperature": 0, "ignore_eos": True}})
        assert out.json()["output_ids"] == merged_greedy(base, dirs["c"], ids, N)
        for body, status, says in [({"lora_name": "c", "lora_path": str(dirs["c"])}, 400, "is loaded"),
                                   ({"lora_name": "d", "lora_path": str(tmp_path)}, 400, "adapter_config.json"),
                                   ({"lora_name": "d"}, 400, "lora_path"),
                                   ({"lora_name": "d", "lora_path": "/x", "extra": 1}, 400, "extra")]:
            r = c.post("/load_lora_adapter", json=body)
            assert r.status_code == status and says in r.json()["error"]["message"], r.text
        assert c.post("/unload_lora_adapter", json={"lora_name": "c"}).json()["adapters"] == ["a", "b"]
        r = c.post("/unload_lora_adapter", json={"lora_name": "c"})
        assert r.status_code == 400 and "no adapter of that name" in r.json()["error"]["message"]
        r = c.post("/generate", json={"input_ids": ids, "lora_path": "c"})
        assert r.status_code == 400
        assert c.get("/health").status_code == 200  # it kept serving through every refusal


def test_only_the_admin_key_may_load_and_a_second_tenant_caches_apart(lora_server):
    server, _, dirs = lora_server
    with server.client() as c:
        c.headers["Authorization"] = f"Bearer {OTHER}"
        r = c.post("/load_lora_adapter", json={"lora_name": "c", "lora_path": str(dirs["c"])})
        assert r.status_code == 403
        text = "Name the planets in order from the sun, briefly. " * 3
        body = {"text": text, "lora_path": "a", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
        with server.client() as first:  # the first tenant (API_KEY)
            first.post("/generate", json=body)
            assert first.post("/generate", json=body).json()["meta_info"]["cached_tokens"] > 20
        assert c.post("/generate", json=body).json()["meta_info"]["cached_tokens"] == 0  # not the other key's cache
