"""Dolphin's OpenAI- and Anthropic-compatible HTTP API through the official Python SDKs.

Usage: check_sdks.py BASE_URL [--responses-store]
  BASE_URL           the router's public HTTP listener, e.g. http://127.0.0.1:8000
  --responses-store  the router keeps responses (--responses-store N): retrieving one and
                     continuing it (previous_response_id) must work, not answer 404

Each check calls the router the way an application would (`openai` and `anthropic`, pinned in
scripts/install-sdks.sh), and fails where the SDK raises or parses something other than the
API's documented shape: completions, chat (streamed, with usage, n and seed, stop, log
probabilities, JSON and pydantic structured output, forced and required tool calls and the
turn after them), the error shapes, the Responses API (whole, streamed, stored where the router
keeps responses, tool calls) and Anthropic's Messages API (whole, streamed, token counting,
forced tools, errors), and SGLang's native `/generate`, read as sglang.bench_serving reads it
(whole, streamed, a batch of token ids with n and log probabilities, errors). Prints one line
per check; exits 1 if any failed. Run by
tests/tests/sdk.rs against SmolLM2 (outputs are short and greedy: the checks read shapes, not
quality), and by hand against any running router: scripts/check-sdks.sh.
"""
import json
import sys
import traceback

import urllib.error
import urllib.request

import anthropic
import openai

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
expect_store = "--responses-store" in sys.argv[2:]
oc = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)
ac = anthropic.Anthropic(base_url=base, api_key="none", max_retries=0, timeout=120)
results = []


def check(name):
    def wrap(f):
        try:
            out = f()
            results.append((name, "PASS", out))
        except Exception as e:  # noqa
            results.append((name, "FAIL", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"))
        return f
    return wrap


MSG = [{"role": "system", "content": "Answer in one short sentence."},
       {"role": "user", "content": "What is the capital of France?"}]
model = None


@check("models.list/retrieve")
def _():
    global model
    ms = oc.models.list()
    model = ms.data[0].id
    m = oc.models.retrieve(model)
    assert m.id == model, m
    return model


@check("completions basic")
def _():
    r = oc.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0)
    assert r.object == "text_completion", r
    c = r.choices[0]
    assert c.text and c.finish_reason in ("length", "stop"), r
    assert r.usage.completion_tokens == 8 or c.finish_reason == "stop", r.usage
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    return repr(c.text)


@check("completions stream + include_usage")
def _():
    s = oc.completions.create(model=model, prompt="The capital of France is", max_tokens=8, temperature=0,
                              stream=True, stream_options={"include_usage": True})
    text, usage, fin = "", None, None
    for ch in s:
        if ch.choices:
            text += ch.choices[0].text
            fin = ch.choices[0].finish_reason or fin
        if ch.usage:
            usage = ch.usage
    assert usage and usage.completion_tokens > 0, usage
    assert fin, fin
    return repr(text)


@check("completions echo + logprobs")
def _():
    r = oc.completions.create(model=model, prompt="Hello there", max_tokens=3, temperature=0, logprobs=2, echo=True)
    lp = r.choices[0].logprobs
    assert lp and lp.tokens and lp.token_logprobs and lp.top_logprobs and lp.text_offset, lp
    assert r.choices[0].text.startswith("Hello there"), r.choices[0].text
    return (len(lp.tokens), lp.token_logprobs[:3])


@check("completions batched prompts")
def _():
    r = oc.completions.create(model=model, prompt=["One,", "Two,"], max_tokens=3, temperature=0)
    assert len(r.choices) == 2 and sorted(c.index for c in r.choices) == [0, 1], r
    return [c.text for c in r.choices]


@check("completions token-id prompt")
def _():
    r = oc.completions.create(model=model, prompt=[1, 2, 3, 4], max_tokens=3, temperature=0)
    return r.choices[0].text


@check("chat basic")
def _():
    r = oc.chat.completions.create(model=model, messages=MSG, max_tokens=32, temperature=0)
    assert r.object == "chat.completion", r
    m = r.choices[0].message
    assert m.role == "assistant" and m.content, m
    assert r.usage.prompt_tokens > 0 and r.id and r.created > 0, r
    return repr(m.content)


@check("chat raw headers")
def _():
    raw = oc.chat.completions.with_raw_response.create(model=model, messages=MSG, max_tokens=4)
    return {k: v for k, v in raw.headers.items() if k.startswith("x-") or k == "content-type"}


@check("chat stream + include_usage")
def _():
    s = oc.chat.completions.create(model=model, messages=MSG, max_tokens=32, temperature=0, stream=True,
                                   stream_options={"include_usage": True})
    roles, text, fin, usage, n = [], "", None, None, 0
    for ch in s:
        n += 1
        assert ch.object == "chat.completion.chunk", ch
        if ch.choices:
            d = ch.choices[0].delta
            if d.role:
                roles.append(d.role)
            text += d.content or ""
            fin = ch.choices[0].finish_reason or fin
        if ch.usage:
            usage = ch.usage
    assert roles[:1] == ["assistant"], roles
    assert fin in ("stop", "length") and usage, (fin, usage)
    return (n, repr(text))


@check("chat stream helper (client.chat.completions.stream)")
def _():
    with oc.chat.completions.stream(model=model, messages=MSG, max_tokens=16, temperature=0) as s:
        for _ in s:
            pass
        final = s.get_final_completion()
    return repr(final.choices[0].message.content)


@check("chat n=2 seed")
def _():
    r = oc.chat.completions.create(model=model, messages=MSG, max_tokens=8, temperature=0.8, n=2, seed=7)
    assert len(r.choices) == 2, r
    r2 = oc.chat.completions.create(model=model, messages=MSG, max_tokens=8, temperature=0.8, n=2, seed=7)
    assert [c.message.content for c in r.choices] == [c.message.content for c in r2.choices]
    return [c.message.content for c in r.choices]


@check("chat stop")
def _():
    r = oc.chat.completions.create(model=model, messages=MSG, max_tokens=32, temperature=0, stop=["Paris"])
    c = r.choices[0]
    assert "Paris" not in (c.message.content or "") and c.finish_reason == "stop", c
    return repr(c.message.content)


@check("chat logprobs")
def _():
    r = oc.chat.completions.create(model=model, messages=MSG, max_tokens=4, temperature=0, logprobs=True, top_logprobs=2)
    lp = r.choices[0].logprobs
    assert lp and lp.content and len(lp.content[0].top_logprobs) == 2, lp
    return [(t.token, round(t.logprob, 3)) for t in lp.content]


@check("chat max_completion_tokens")
def _():
    r = oc.chat.completions.create(model=model, messages=MSG, max_completion_tokens=3, temperature=0)
    assert r.usage.completion_tokens <= 3 and r.choices[0].finish_reason == "length", r
    return r.usage.completion_tokens


@check("chat json_object")
def _():
    r = oc.chat.completions.create(model=model, messages=[{"role": "user", "content": "Give a JSON object with key city."}],
                                   max_tokens=40, temperature=0, response_format={"type": "json_object"})
    c = r.choices[0]
    if c.finish_reason == "stop":
        json.loads(c.message.content)
    return (c.finish_reason, c.message.content)


@check("chat json_schema via parse (pydantic)")
def _():
    from pydantic import BaseModel

    class City(BaseModel):
        name: str
        country: str

    r = oc.chat.completions.parse(model=model, messages=[{"role": "user", "content": "Name a city."}],
                                  max_tokens=60, temperature=0, response_format=City)
    return (r.choices[0].finish_reason, r.choices[0].message.parsed)


TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
          "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@check("chat tools (named tool_choice)")
def _():
    r = oc.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                   tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                                   max_tokens=40, temperature=0)
    c = r.choices[0]
    tc = c.message.tool_calls
    assert tc and tc[0].function.name == "get_weather", c
    json.loads(tc[0].function.arguments)
    return (c.finish_reason, tc[0].id, tc[0].function.arguments)


@check("chat tools required, stream, then tool result turn")
def _():
    s = oc.chat.completions.create(model=model, messages=[{"role": "user", "content": "Weather in Paris?"}],
                                   tools=TOOLS, tool_choice="required", max_tokens=40, temperature=0, stream=True)
    calls = {}
    fin = None
    for ch in s:
        if not ch.choices:
            continue
        for d in ch.choices[0].delta.tool_calls or []:
            e = calls.setdefault(d.index, {"id": None, "name": "", "args": ""})
            e["id"] = d.id or e["id"]
            if d.function:
                e["name"] += d.function.name or ""
                e["args"] += d.function.arguments or ""
        fin = ch.choices[0].finish_reason or fin
    assert calls and fin == "tool_calls", (calls, fin)
    c = calls[0]
    json.loads(c["args"])
    # The turn after the call, with the tools still listed (tool_choice "none": this router may
    # run without a tool-call parser, which "auto" needs).
    r = oc.chat.completions.create(model=model, max_tokens=20, temperature=0, tools=TOOLS, tool_choice="none", messages=[
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["args"]}}]},
        {"role": "tool", "tool_call_id": c["id"], "content": "Sunny, 21 C"}])
    return (c, r.choices[0].message.content)


def raises(error, call):
    """The error `call` raises, which must be an `error`."""
    try:
        call()
    except error as e:
        return e
    raise AssertionError(f"no {error.__name__}")


@check("error: unknown model -> 404")
def _():
    return raises(openai.NotFoundError, lambda: oc.chat.completions.create(
        model="no-such-model", messages=MSG, max_tokens=4)).body


@check("error: negative temperature -> 400")
def _():
    return raises(openai.BadRequestError, lambda: oc.chat.completions.create(
        model=model, messages=MSG, max_tokens=4, temperature=-1)).body


@check("error: empty messages -> 400")
def _():
    return raises(openai.BadRequestError, lambda: oc.chat.completions.create(
        model=model, messages=[], max_tokens=4)).body


@check("error: embeddings -> clear error")
def _():
    e = raises(openai.APIStatusError, lambda: oc.embeddings.create(model=model, input="hi"))
    return (e.status_code, e.body)


@check("responses create + retrieve + previous_response_id")
def _():
    r = oc.responses.create(model=model, input="What is the capital of France?", instructions="Answer in one short sentence.",
                            max_output_tokens=24, temperature=0)
    assert r.status == "completed" or r.status == "incomplete", r
    t = r.output_text
    try:
        g = oc.responses.retrieve(r.id)
    except openai.NotFoundError as e:
        if expect_store:
            raise
        return ("not kept (router without --responses-store)", e.body)
    assert g.id == r.id and g.output_text == t
    r2 = oc.responses.create(model=model, input="And of Italy?", previous_response_id=r.id, max_output_tokens=24, temperature=0)
    return (repr(t), repr(r2.output_text), r2.usage.input_tokens > r.usage.input_tokens)


@check("responses stream")
def _():
    kinds, text = [], ""
    with oc.responses.stream(model=model, input="Say hi in one word.", instructions="Answer in one word.", max_output_tokens=64, temperature=0) as s:
        for ev in s:
            kinds.append(ev.type)
            if ev.type == "response.output_text.delta":
                text += ev.delta
        final = s.get_final_response()
    assert final.output_text == text, (final.output_text, text)
    return sorted(set(kinds))


@check("responses tools")
def _():
    tools = [{"type": "function", "name": "get_weather", "description": "Weather for a city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    r = oc.responses.create(model=model, input="Weather in Paris?", tools=tools, tool_choice="required",
                            max_output_tokens=40, temperature=0)
    calls = [o for o in r.output if o.type == "function_call"]
    assert calls, r.output
    return (calls[0].name, calls[0].arguments)


@check("anthropic messages")
def _():
    r = ac.messages.create(model=model, max_tokens=24, system="Answer in one short sentence.",
                           messages=[{"role": "user", "content": "What is the capital of France?"}], extra_body={"temperature": 0})
    assert r.type == "message" and r.role == "assistant" and r.content[0].type == "text", r
    assert r.stop_reason in ("end_turn", "max_tokens"), r
    return (repr(r.content[0].text), r.usage)


@check("anthropic stream helper")
def _():
    with ac.messages.stream(model=model, max_tokens=24, messages=[{"role": "user", "content": "Say hi."}]) as s:
        text = "".join(s.text_stream)
        final = s.get_final_message()
    assert final.content[0].text == text
    return (repr(text), final.stop_reason, final.usage)


@check("anthropic count_tokens")
def _():
    r = ac.messages.count_tokens(model=model, messages=[{"role": "user", "content": "Say hi."}])
    return r.input_tokens


@check("anthropic tools")
def _():
    tools = [{"name": "get_weather", "description": "Weather for a city",
              "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}]
    # Greedy (the SDK has no temperature keyword): sampled, SmolLM2 sometimes writes more keys
    # than 60 tokens hold, and the answer then ends in max_tokens, not tool_use.
    r = ac.messages.create(model=model, max_tokens=60, tools=tools, tool_choice={"type": "tool", "name": "get_weather"},
                           extra_body={"temperature": 0},
                           messages=[{"role": "user", "content": "Weather in Paris?"}])
    uses = [b for b in r.content if b.type == "tool_use"]
    assert uses and r.stop_reason == "tool_use", r
    return (uses[0].name, uses[0].input)


@check("anthropic error shape")
def _():
    return raises(anthropic.BadRequestError, lambda: ac.messages.create(
        model=model, max_tokens=0, messages=[{"role": "user", "content": "x"}])).body


# SGLang's native API, read the way sglang.bench_serving's default backend and SGLang's docs
# read it (plain HTTP: SGLang has no SDK for it).
SG_PROMPT = "The capital of France is"


class Answer:
    def __init__(self, status, body):
        self.status_code, self.text = status, body

    def json(self):
        return json.loads(self.text)


class Plain:
    """Plain HTTP with the standard library: JSON in, the status and body out."""

    def open(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            return urllib.request.urlopen(req, timeout=120)
        except urllib.error.HTTPError as e:
            return e

    def post(self, path, json=None):
        with self.open("POST", path, json) as r:
            return Answer(r.status, r.read().decode())

    def get(self, path):
        with self.open("GET", path) as r:
            return Answer(r.status, r.read().decode())

    def lines(self, path, body):
        """The status and the body's lines as they arrive."""
        r = self.open("POST", path, body)
        return r.status, (line.decode() for line in r)


sg = Plain()


@check("sglang /generate")
def _():
    r = sg.post("/generate", json={"text": SG_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}})
    assert r.status_code == 200, r.text
    out = r.json()
    meta = out["meta_info"]
    assert meta["finish_reason"]["type"] in ("length", "stop"), out
    assert meta["completion_tokens"] == len(out["output_ids"]) > 0, out
    assert meta["prompt_tokens"] > 0 and meta["id"], out
    return repr(out["text"])


@check("sglang /generate stream (bench_serving's reader)")
def _():
    whole = sg.post("/generate", json={"text": SG_PROMPT, "sampling_params": {"temperature": 0, "max_new_tokens": 8}}).json()
    payload = {"text": SG_PROMPT, "sampling_params": {"temperature": 0.0, "max_new_tokens": 8, "ignore_eos": False},
               "stream": True, "lora_path": None, "return_logprob": False, "logprob_start_len": -1}
    text, output_len, last_len, events = "", 0, 0, 0
    status, lines = sg.lines("/generate", payload)
    assert status == 200, "".join(lines)
    for line in lines:
        line = line.strip()
        if not line:
            continue
        chunk = line.removeprefix("data: ")
        if chunk == "[DONE]":
            continue
        data = json.loads(chunk)
        if data.get("text"):
            assert data["text"].startswith(text), (text, data)
            text = data["text"]
            output_len = data["meta_info"]["completion_tokens"]
            assert output_len >= last_len, data
            last_len = output_len
            events += 1
    assert text == whole["text"] and output_len == whole["meta_info"]["completion_tokens"], (text, whole)
    return (repr(text), events)


@check("sglang /generate batch, n, logprobs")
def _():
    ids = sg.post("/tokenize", json={"prompt": SG_PROMPT}).json()["tokens"]
    r = sg.post("/generate", json={"input_ids": [ids, ids[:3]], "return_logprob": True, "top_logprobs_num": 2,
                                    "sampling_params": {"max_new_tokens": 4, "n": 2, "sampling_seed": 7}})
    assert r.status_code == 200, r.text
    outs = r.json()
    assert len(outs) == 4, outs
    for o in outs:
        lps = o["meta_info"]["output_token_logprobs"]
        assert [t[1] for t in lps] == o["output_ids"], o
        assert all(len(top) == 2 for top in o["meta_info"]["output_top_logprobs"]), o
    return [o["text"] for o in outs]


@check("sglang /get_model_info, scoring, errors")
def _():
    info = sg.get("/get_model_info").json()
    assert info["is_generation"] is True and info["model_path"], info
    # Scoring a text as SGLang's frontend does: prefill only, the prompt's log probabilities.
    r = sg.post("/generate", json={"text": SG_PROMPT, "return_logprob": True, "logprob_start_len": 0,
                                    "sampling_params": {"max_new_tokens": 0}})
    assert r.status_code == 200, r.text
    scored = r.json()
    assert scored["text"] == "" and scored["meta_info"]["completion_tokens"] == 0, scored
    lps = scored["meta_info"]["input_token_logprobs"]
    assert len(lps) == scored["meta_info"]["prompt_tokens"] and lps[0][0] is None, scored
    assert all(lp[0] <= 0 for lp in lps[1:]), scored
    r = sg.post("/generate", json={"text": SG_PROMPT, "sampling_params": {"max_new_token": 4}})
    assert r.status_code == 400 and "max_new_token" in r.json()["error"]["message"], r.text
    return info["model_path"]


for name, st, out in results:
    print(f"{st} {name}: {str(out)[:2000] if st == 'FAIL' else str(out)[:300]}")
passed = sum(1 for r in results if r[1] == "PASS")
print(f"{passed} / {len(results)} passed")
sys.exit(0 if passed == len(results) else 1)
