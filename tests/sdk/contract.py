#!/usr/bin/env python3
"""Contract test: the official Python SDKs (pinned in tests/sdk/requirements.txt: openai,
replicate, fal-client, google-genai) against a running `tally mock-provider`; BFL and Photoroom
publish no official client, so their styles are checked over plain HTTP against their documented
shapes (Photoroom's as its own published code sample sends it).

Usage: contract.py BASE_URL   (e.g. http://127.0.0.1:7800; the mock must have been started
without behaviour flags, its ledger empty).

Each check prints one line; any SDK that cannot parse a mock answer, or a mock that accepts
what the real API refuses, fails the run (exit 1). This holds the mock to what nobody here
wrote: if the mock drifts from the real schemas, these clients say so.

Longer than 600 lines on purpose: one check per SDK call shape, all against the same running
mock and ledger, read best as one list.
"""
import base64
import io
import json
import sys
import time
import traceback
import urllib.request

import httpx

BASE = sys.argv[1].rstrip("/")
PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)
DATA_URI = "data:image/png;base64," + base64.b64encode(PNG).decode()
results = []


def check(name):
    def wrap(fn):
        try:
            fn()
            results.append((name, None))
            print(f"ok   {name}")
        except Exception as e:  # noqa: BLE001 - every failure is reported, none hidden
            results.append((name, e))
            print(f"FAIL {name}: {type(e).__name__}: {e}")
            traceback.print_exc(limit=3)
        return fn

    return wrap


def behave(**patch):
    req = urllib.request.Request(
        BASE + "/_mock/behavior", data=json.dumps(patch).encode(), method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:
        assert r.status == 200, r.status


def reset():
    behave(**{k: None for k in (
        "latency_ms", "fail_status", "reject_status", "retry_after_s", "drop_response", "drop_on",
        "job_duration_ms", "result_ttl_s", "honor_idempotency_key", "unknown_inputs", "retired_models",
        "job_error", "error_echoes_key", "openai_url_answers", "moderation", "error_code")})
    # Issue 25's knobs (documented but less common answers).
    behave(**{k: None for k in (
        "retry_after_ms", "retry_after_form", "ratelimit_headers", "rate_limit_times", "out_of_credit",
        "result_fetch_failures", "result_fetch_status", "fal_result_not_retryable", "job_canceled",
        "job_failure_logs", "rate_limit_meta", "ratelimit_exhausted_ms", "draft_answer")})
    behave(job_duration_ms=150)


def ledger():
    with urllib.request.urlopen(BASE + "/_mock/ledger", timeout=10) as r:
        return json.loads(r.read())


def charged(prompt):
    return sum(1 for l in ledger() if l.get("prompt") == prompt and l.get("charged"))


def is_png(b):
    assert b.startswith(b"\x89PNG\r\n\x1a\n"), b[:16]


def read_output(o):
    """A run() output: replicate turns only https:// URLs into FileOutput; the mock is http."""
    return o.read() if hasattr(o, "read") else httpx.get(o, headers={"Authorization": "Bearer r8_test"}).content


# ---------------------------------------------------------------- OpenAI (openai)
import openai  # noqa: E402

oa = openai.OpenAI(api_key="sk-test", base_url=BASE + "/v1", max_retries=0)
MODEL = "gpt-image-2.5-flare"


@check("openai images.generate parses, b64 PNG, usage/created/output_format set")
def _():
    reset()
    r = oa.images.generate(model=MODEL, prompt="oa generate", size="1024x1024", n=1)
    assert isinstance(r.created, int) and r.created > 0
    assert r.usage is not None and r.usage.total_tokens > 0, r.usage
    assert r.output_format == "png" and r.size == "1024x1024" and r.quality == "medium"
    is_png(base64.b64decode(r.data[0].b64_json))
    assert charged("oa generate") == 1


@check("openai images.edit with two reference images (image[]) and with one (image)")
def _():
    reset()
    r = oa.images.edit(model=MODEL, image=[("a.png", PNG, "image/png"), ("b.png", PNG, "image/png")], prompt="oa edit two")
    is_png(base64.b64decode(r.data[0].b64_json))
    r = oa.images.edit(model=MODEL, image=("a.png", PNG, "image/png"), prompt="oa edit one")
    is_png(base64.b64decode(r.data[0].b64_json))
    lines = {l["prompt"]: l for l in ledger() if l.get("prompt", "") and l["prompt"].startswith("oa edit")}
    assert lines["oa edit two"]["reference_images"] == 2 and lines["oa edit one"]["reference_images"] == 1, lines


@check("openai: retired dall-e-3 (default) and shut-down gpt-image-1 (when listed) are 404 model_not_found")
def _():
    reset()
    behave(retired_models=["gpt-image-1", "dall-e-2", "dall-e-3"])  # the SDK's deprecated list
    for model in ("gpt-image-1", "dall-e-3"):
        try:
            oa.images.generate(model=model, prompt="oa retired " + model)
        except openai.NotFoundError as e:
            assert e.code == "model_not_found", e.code
        else:
            raise AssertionError(f"{model} was accepted")
        assert charged("oa retired " + model) == 0
    reset()
    try:
        oa.images.generate(model="dall-e-2", prompt="oa retired by default")
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("dall-e-2 was accepted by default")


@check("openai: response_format is refused for GPT image models; unknown parameters too")
def _():
    reset()
    for extra in ({"response_format": "url"}, {"extra_body": {"tally_marker": "x"}}):
        try:
            oa.images.generate(model=MODEL, prompt="oa bad param", **extra)
        except openai.BadRequestError:
            pass
        else:
            raise AssertionError(f"{extra} was accepted")


@check("openai: a gateway-style url answer parses and downloads")
def _():
    reset()
    behave(openai_url_answers=True)
    r = oa.images.generate(model=MODEL, prompt="oa url")
    is_png(httpx.get(r.data[0].url).content)


@check("openai: reject/rate-limit/5xx map to the SDK's error classes")
def _():
    reset()
    for patch, cls in (({"reject_status": 400}, openai.BadRequestError),
                       ({"retry_after_s": 3}, openai.RateLimitError),
                       ({"fail_status": 500}, openai.InternalServerError)):
        reset()
        behave(**patch)
        try:
            oa.images.generate(model=MODEL, prompt="oa err")
        except cls:
            pass
        else:
            raise AssertionError(f"{patch} did not raise {cls.__name__}")


@check("openai: Idempotency-Key is ignored unless the mock is told to honour it")
def _():
    reset()
    h = {"Idempotency-Key": "same-key-1"}
    oa.images.generate(model=MODEL, prompt="oa idem off", extra_headers=h)
    oa.images.generate(model=MODEL, prompt="oa idem off", extra_headers=h)
    assert charged("oa idem off") == 2, "the real API honours no key: both are charged"
    behave(honour_idempotency_key=True)
    h = {"Idempotency-Key": "same-key-2"}
    a = oa.images.generate(model=MODEL, prompt="oa idem on", extra_headers=h)
    b = oa.images.generate(model=MODEL, prompt="oa idem on", extra_headers=h)
    assert charged("oa idem on") == 1 and a.data[0].b64_json == b.data[0].b64_json


# ---------------------------------------------------------------- Replicate (replicate)
import replicate  # noqa: E402
from replicate.exceptions import ReplicateError  # noqa: E402
from replicate.pagination import paginate  # noqa: E402

rc = replicate.Client(api_token="r8_test", base_url=BASE)


@check("replicate models.get: latest_version.openapi_schema names the inputs (flux-schnell has aspect_ratio, no image)")
def _():
    reset()
    m = rc.models.get("black-forest-labs/flux-schnell")
    props = m.latest_version.openapi_schema["components"]["schemas"]["Input"]["properties"]
    assert "aspect_ratio" in props and "width" not in props and "image" not in props, sorted(props)
    dev = rc.models.get("black-forest-labs/flux-dev")
    v = dev.versions.get(dev.latest_version.id)
    assert "image" in v.openapi_schema["components"]["schemas"]["Input"]["properties"]


@check("replicate models.predictions.create → wait → succeeded; version is 'hidden'; output downloads")
def _():
    reset()
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep official", "aspect_ratio": "1:1"})
    assert p.version == "hidden" and p.status == "starting" and p.urls["cancel"] and p.urls["web"], p
    p.wait()
    assert p.status == "succeeded" and p.completed_at and p.started_at and p.metrics["predict_time"] >= 0, p
    is_png(httpx.get(p.output[0], headers={"Authorization": "Bearer r8_test"}).content)
    assert charged("rep official") == 1


@check("replicate predictions.create(version=…) and run('owner/name:version') with an image input")
def _():
    reset()
    version = rc.models.get("black-forest-labs/flux-dev").latest_version.id
    p = rc.predictions.create(version=version, input={"prompt": "rep version", "image": DATA_URI})
    assert p.version == version, p.version
    p.wait()
    assert p.status == "succeeded", p
    out = rc.run(f"black-forest-labs/flux-dev:{version}", input={"prompt": "rep run version"})
    is_png(read_output(out[0]))
    assert [l["reference_images"] for l in ledger() if l.get("prompt") == "rep version"] == [1]


@check("replicate run() of flux-kontext-pro answers one file, not a list")
def _():
    reset()
    out = rc.run("black-forest-labs/flux-kontext-pro", input={"prompt": "rep kontext", "input_image": DATA_URI})
    assert isinstance(out, str) or hasattr(out, "read"), type(out)
    is_png(read_output(out))


@check("replicate predictions.list: 100 per page, next followed by paginate(); created_after filters")
def _():
    reset()
    behave(job_duration_ms=0)
    before = time.time()
    for i in range(101):
        rc.models.predictions.create(model="acme/flux", input={"prompt": f"rep list {i}"})
    pages = list(paginate(rc.predictions.list))
    assert len(pages[0].results) == 100 and pages[0].next, len(pages[0].results)
    total = sum(len(p.results) for p in pages)
    assert total >= 101, total
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(before + 3600))
    r = httpx.get(BASE + "/v1/predictions", params={"created_after": stamp}, headers={"Authorization": "Bearer r8_test"})
    assert r.status_code == 200 and r.json()["results"] == [], r.text[:200]


@check("replicate predictions.cancel → canceled")
def _():
    reset()
    behave(job_duration_ms=60000)
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep cancel"})
    c = rc.predictions.cancel(p.id)
    assert c.status == "canceled", c.status
    assert rc.predictions.get(p.id).status == "canceled"


@check("replicate: after retention a succeeded prediction has output null and data_removed")
def _():
    reset()
    behave(job_duration_ms=0, result_ttl_s=0)
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep expired"})
    got = rc.predictions.get(p.id)
    assert got.status == "succeeded" and got.output is None, got
    raw = httpx.get(BASE + f"/v1/predictions/{p.id}", headers={"Authorization": "Bearer r8_test"}).json()
    assert raw["data_removed"] is True and raw["output"] is None and raw["input"] == {}, raw


@check("replicate: unknown inputs are stripped (default) or refused with 422 (Cog 0.17.x)")
def _():
    reset()
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep strip", "tally_marker": "m", "width": 1024})
    assert "tally_marker" not in p.input and "width" not in p.input, p.input
    behave(unknown_inputs="reject")
    try:
        rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep reject", "tally_marker": "m"})
    except ReplicateError as e:
        assert e.status == 422, e.status
    else:
        raise AssertionError("an unknown input was accepted in reject mode")
    assert charged("rep reject") == 0


@check("replicate: a failed prediction reports failed with its error")
def _():
    reset()
    behave(job_duration_ms=0, job_error="NSFW content detected")
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep failed"})
    p.wait()
    assert p.status == "failed" and "NSFW" in (p.error or ""), p


# ---------------------------------------------------------------- fal (fal-client)
import fal_client  # noqa: E402
import fal_client.client as fal_mod  # noqa: E402

# fal-client hard-codes https://queue.fal.run/; point its queue base at the mock's fal style.
fal_mod.QUEUE_URL_FORMAT = BASE + "/fal/"
fc = fal_client.SyncClient(key="test-key")


@check("fal submit answers subpath-less status/response/cancel URLs; status phases parse (IN_QUEUE with queue_position)")
def _():
    reset()
    # The first third of the job is its queue phase: 1 s, so the status asked for at once is
    # still Queued on a loaded machine.
    behave(job_duration_ms=3000)
    h = fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal submit"})
    assert "/fal/fal-ai/flux/requests/" in h.status_url and "/dev/" not in h.status_url, h.status_url
    first = h.status()
    assert isinstance(first, fal_client.Queued) and first.position == 0, first
    seen = set()
    for ev in h.iter_events(with_logs=True, interval=0.05):
        seen.add(type(ev).__name__)
    assert {"InProgress", "Completed"} <= seen, seen
    res = h.get()
    is_png(httpx.get(res["images"][0]["url"]).content)
    assert charged("fal submit") == 1


@check("fal status/result from a request id alone (get_handle builds owner/alias/requests/id)")
def _():
    reset()
    h = fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal by id"})
    res = fc.result("fal-ai/flux/dev", h.request_id)
    assert res["images"][0]["content_type"] == "image/png"
    st = fc.status("fal-ai/flux/dev", h.request_id, with_logs=True)
    assert isinstance(st, fal_client.Completed) and st.error is None and isinstance(st.logs, list), st


@check("fal: a status path under the model subpath is 404, as fal documents not to use it")
def _():
    reset()
    h = fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal subpath"})
    r = httpx.get(f"{BASE}/fal/fal-ai/flux/dev/requests/{h.request_id}/status", headers={"Authorization": "Key test-key"})
    assert r.status_code == 404, r.status_code


@check("fal subscribe() with logs and queue updates")
def _():
    reset()
    updates = []
    res = fc.subscribe("fal-ai/flux/schnell", arguments={"prompt": "fal subscribe"}, with_logs=True,
                       on_queue_update=updates.append)
    assert res["images"] and updates, (res, updates)


@check("fal cancel → CANCELLATION_REQUESTED, then COMPLETED with an error")
def _():
    reset()
    behave(job_duration_ms=60000)
    h = fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal cancel"})
    h.cancel()
    st = h.status()
    assert isinstance(st, fal_client.Completed) and st.error, st


@check("fal: a failed request is COMPLETED with error/error_type; its result is an HTTP error")
def _():
    reset()
    behave(job_duration_ms=0, job_error="model crashed")
    h = fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal failed"})
    st = h.status()
    assert isinstance(st, fal_client.Completed) and st.error == "model crashed" and st.error_type, st
    try:
        h.get()
    except fal_client.client.FalClientHTTPError as e:
        assert e.status_code == 500, e.status_code
    else:
        raise AssertionError("a failed request's result was served")


# ---------------------------------------------------------------- DashScope (dashscope)
import dashscope  # noqa: E402
from dashscope import ImageSynthesis  # noqa: E402

# The SDK reads its base URL at call time (env DASHSCOPE_HTTP_BASE_URL sets it at import).
dashscope.base_http_api_url = BASE + "/dashscope/api/v1"
dashscope.api_key = "sk-test-dashscope"
DS_MODEL = "wan2.2-t2i-flash"


def cst_stamp(t):
    """YYYYMMDDhhmmss in China Standard Time, the mock's reading of the listing filters."""
    return time.strftime("%Y%m%d%H%M%S", time.gmtime(t + 8 * 3600))


@check("dashscope ImageSynthesis.async_call → PENDING task id; fetch parses; wait → SUCCEEDED; image downloads")
def _():
    reset()
    # Long enough that the fetch made at once still finds it running on a loaded machine.
    behave(job_duration_ms=3000)
    rsp = ImageSynthesis.async_call(model=DS_MODEL, prompt="ds async", n=1, size="1024*1024")
    assert rsp.status_code == 200, rsp
    assert rsp.output.task_id and rsp.output.task_status == "PENDING", rsp.output
    early = ImageSynthesis.fetch(rsp)
    assert early.status_code == 200 and early.output.task_status in ("PENDING", "RUNNING"), early
    done = ImageSynthesis.wait(rsp)
    assert done.status_code == 200 and done.output.task_status == "SUCCEEDED", done
    assert done.usage.image_count == 1, done.usage
    result = done.output.results[0]
    assert result.orig_prompt == "ds async" and result.url, result
    is_png(httpx.get(result.url).content)
    assert charged("ds async") == 1


@check("dashscope ImageSynthesis.call (async create + wait) on the image2image service with images")
def _():
    reset()
    rsp = ImageSynthesis.call(model="wan2.5-i2i-preview", prompt="ds edit", images=[DATA_URI, DATA_URI])
    assert rsp.status_code == 200 and rsp.output.task_status == "SUCCEEDED", rsp
    line = [l for l in ledger() if l.get("prompt") == "ds edit"]
    assert line and line[0]["reference_images"] == 2 and "image-synthesis" in line[0]["endpoint"], line


@check("dashscope ImageSynthesis.list: start_time/end_time/model_name/status filters and paging")
def _():
    reset()
    behave(job_duration_ms=0)
    before = time.time() - 5
    ids = [ImageSynthesis.async_call(model=DS_MODEL, prompt=f"ds list {i}").output.task_id for i in range(3)]
    after = time.time() + 5
    got = ImageSynthesis.list(start_time=cst_stamp(before), end_time=cst_stamp(after), model_name=DS_MODEL,
                              status="SUCCEEDED", page_no=1, page_size=2)
    assert got.status_code == 200, got
    out = got.output
    assert out["total"] >= 3 and out["page_size"] == 2 and out["total_page"] >= 2, out
    assert out["data"][0]["task_id"] == ids[2] and isinstance(out["data"][0]["gmt_create"], int), out["data"][0]
    page2 = ImageSynthesis.list(start_time=cst_stamp(before), end_time=cst_stamp(after), model_name=DS_MODEL,
                                page_no=2, page_size=2)
    assert ids[0] in [t["task_id"] for t in page2.output["data"]], page2.output
    none = ImageSynthesis.list(model_name="qwen-image", start_time=cst_stamp(before), end_time=cst_stamp(after))
    assert none.output["data"] == [] and none.output["total"] == 0, none.output
    later = ImageSynthesis.list(start_time=cst_stamp(after + 60), end_time=cst_stamp(after + 120))
    assert later.output["total"] == 0, later.output


@check("dashscope ImageSynthesis.cancel of a PENDING task → CANCELED; of a finished one → UnsupportedOperation")
def _():
    reset()
    behave(job_duration_ms=60000)
    rsp = ImageSynthesis.async_call(model=DS_MODEL, prompt="ds cancel")
    c = ImageSynthesis.cancel(rsp)
    assert c.status_code == 200, c
    assert ImageSynthesis.fetch(rsp).output.task_status == "CANCELED"
    again = ImageSynthesis.cancel(rsp)
    assert again.status_code == 400 and again.code == "UnsupportedOperation", again


@check("dashscope: a FAILED task carries code/message and is not charged; an unknown id is UNKNOWN")
def _():
    reset()
    behave(job_duration_ms=0, job_error="DataInspectionFailed: Output data may contain inappropriate content.")
    rsp = ImageSynthesis.async_call(model=DS_MODEL, prompt="ds failed")
    done = ImageSynthesis.wait(rsp)
    assert done.output.task_status == "FAILED" and done.output.code == "DataInspectionFailed", done.output
    assert charged("ds failed") == 0, "only successful images are billed"
    unknown = ImageSynthesis.fetch("00000000-0000-0000-0000-000000000000")
    assert unknown.status_code == 200 and unknown.output.task_status == "UNKNOWN", unknown


@check("dashscope: errors in the SDK's code/message (InvalidParameter, Throttling, Arrearage, DataInspectionFailed)")
def _():
    for patch, status, code in (({}, 400, "InvalidParameter"),
                                ({"retry_after_s": 2}, 429, "Throttling.RateQuota"),
                                ({"out_of_credit": True}, 400, "Arrearage"),
                                ({"reject_status": 400, "error_code": "DataInspectionFailed"}, 400, "DataInspectionFailed")):
        reset()
        behave(**patch)
        model = "no-such-model" if not patch else DS_MODEL
        rsp = ImageSynthesis.async_call(model=model, prompt="ds err")
        assert rsp.status_code == status and rsp.code == code, (patch, rsp)
    assert charged("ds err") == 0


# ---------------------------------------------------------------- Gemini (google-genai)
from google import genai  # noqa: E402
from google.genai import types as gtypes  # noqa: E402

# google-genai 3.3.0 calls API version v1 by default; tally's adapter calls v1beta (the Batch
# API's documented version): the mock serves both, and both are checked.
gm = genai.Client(api_key="gm-test", http_options=gtypes.HttpOptions(base_url=BASE + "/gemini"))
gm_beta = genai.Client(api_key="gm-test", http_options=gtypes.HttpOptions(base_url=BASE + "/gemini", api_version="v1beta"))
GEMINI = "gemini-2.5-flash-image"


def gemini_image(resp):
    parts = resp.candidates[0].content.parts
    blobs = [p.inline_data for p in parts if p.inline_data is not None]
    assert blobs and blobs[0].mime_type == "image/png", parts
    is_png(blobs[0].data)


@check("gemini generate_content: the image inline (inline_data), usage_metadata, with a reference photo")
def _():
    reset()
    r = gm.models.generate_content(
        model=GEMINI,
        contents=["gm generate", gtypes.Part.from_bytes(data=PNG, mime_type="image/png")],
        config=gtypes.GenerateContentConfig(response_modalities=["TEXT", "IMAGE"],
                                            image_config=gtypes.ImageConfig(aspect_ratio="1:1")),
    )
    gemini_image(r)
    assert r.candidates[0].finish_reason == gtypes.FinishReason.STOP, r.candidates[0].finish_reason
    assert r.usage_metadata.prompt_token_count > 0 and r.usage_metadata.total_token_count > 0
    assert charged("gm generate") == 1
    assert [l["reference_images"] for l in ledger() if l.get("prompt") == "gm generate"] == [1]
    gemini_image(gm_beta.models.generate_content(model=GEMINI, contents="gm generate v1beta"))


@check("gemini: a blocked prompt (prompt_feedback.block_reason) and a blocked image (IMAGE_SAFETY)")
def _():
    reset()
    behave(moderation="prompt")
    r = gm.models.generate_content(model=GEMINI, contents="gm blocked")
    assert not r.candidates and r.prompt_feedback.block_reason == gtypes.BlockedReason.SAFETY, r
    behave(moderation="output")
    r = gm.models.generate_content(model=GEMINI, contents="gm unsafe image")
    assert r.candidates[0].finish_reason == gtypes.FinishReason.IMAGE_SAFETY, r.candidates[0]
    assert not (r.candidates[0].content and r.candidates[0].content.parts), r.candidates[0]


@check("gemini: an unknown model is 404 NOT_FOUND, an unknown field 400 INVALID_ARGUMENT (not charged)")
def _():
    reset()
    try:
        gm.models.generate_content(model="imagine-9", contents="gm no model")
    except genai.errors.ClientError as e:
        assert e.code == 404 and e.status == "NOT_FOUND", (e.code, e.status)
    else:
        raise AssertionError("an unknown model was accepted")
    r = httpx.post(BASE + "/gemini/v1beta/models/" + GEMINI + ":generateContent", headers={"x-goog-api-key": "k"},
                   json={"contents": [{"parts": [{"text": "gm bad field"}]}], "prompt": "x"})
    assert r.status_code == 400 and r.json()["error"]["status"] == "INVALID_ARGUMENT", r.text
    assert charged("gm no model") == 0 and charged("gm bad field") == 0


@check("gemini batches: create (named before any work), get until SUCCEEDED with the answer inline, list pages")
def _():
    reset()
    behave(job_duration_ms=200)
    names = []
    for i in range(3):
        job = gm.batches.create(
            model=GEMINI,
            src=[{"contents": [{"parts": [{"text": f"gm batch {i}"}], "role": "user"}]}],
            config={"display_name": f"tally-contract-{i}"},
        )
        assert job.name.startswith("batches/") and job.display_name == f"tally-contract-{i}", job
        assert job.state == gtypes.JobState.JOB_STATE_PENDING, job.state
        names.append(job.name)
    for _ in range(100):
        job = gm.batches.get(name=names[0])
        if job.done:
            break
        time.sleep(0.05)
    assert job.state == gtypes.JobState.JOB_STATE_SUCCEEDED, job.state
    gemini_image(job.dest.inlined_responses[0].response)
    listed = [j.display_name for j in gm.batches.list(config={"page_size": 2})]
    assert listed[:3] == ["tally-contract-2", "tally-contract-1", "tally-contract-0"], listed
    assert sum(charged(f"gm batch {i}") for i in range(3)) == 3


# ---------------------------------------------------------------- BFL (no official client: its documented HTTP)
BFL = BASE + "/bfl"


@check("bfl: POST /v1/{model} with x-key → id + polling_url; poll it: Pending, then Ready with result.sample")
def _():
    reset()
    # Long enough that the first poll, made at once, sees the job still running even on a
    # loaded machine (200 ms was not, under a CI load average of 30).
    behave(job_duration_ms=3000)
    r = httpx.post(BFL + "/v1/flux-pro-1.1", headers={"x-key": "bfl-test"},
                   json={"prompt": "bfl plain", "width": 1024, "height": 768})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["id"] and body["polling_url"].startswith(BFL + "/v1/get_result?id="), body
    seen = set()
    for _ in range(400):
        p = httpx.get(body["polling_url"], headers={"x-key": "bfl-test"}).json()
        seen.add(p["status"])
        if p["status"] != "Pending":
            break
        time.sleep(0.05)
    assert p["status"] == "Ready" and "Pending" in seen, (p, seen)
    img = httpx.get(p["result"]["sample"])
    assert img.status_code == 200
    is_png(img.content)
    assert charged("bfl plain") == 1


@check("bfl: moderation statuses (not charged), Task not found, 401 without x-key, 422 bad width, 404 unknown model")
def _():
    reset()
    behave(job_duration_ms=0, moderation="prompt")
    r = httpx.post(BFL + "/v1/flux-kontext-pro", headers={"x-key": "k"}, json={"prompt": "bfl moderated"}).json()
    p = httpx.get(r["polling_url"], headers={"x-key": "k"}).json()
    assert p["status"] == "Request Moderated" and p["result"] is None, p
    assert charged("bfl moderated") == 0
    p = httpx.get(BFL + "/v1/get_result?id=nope", headers={"x-key": "k"}).json()
    assert p["status"] == "Task not found", p
    assert httpx.post(BFL + "/v1/flux-pro-1.1", json={"prompt": "bfl no key"}).status_code == 401
    assert httpx.post(BFL + "/v1/flux-pro-1.1", headers={"x-key": "k"},
                      json={"prompt": "bfl bad", "width": 1000}).status_code == 422
    assert httpx.post(BFL + "/v1/flux-imaginary", headers={"x-key": "k"}, json={"prompt": "x"}).status_code == 404



# ---------------------------------------------------------------- issue 25: less common answers
# ---------------------------------------------------------------- Photoroom (no official SDK)
# Photoroom publishes no SDK; its API reference and its own Python sample
# (docs.photoroom.com/remove-background-api-basic-plan/code-samples/python-integration, and
# github.com/Photoroom/api-code-samples) send `POST https://sdk.photoroom.com/v1/segment` as
# multipart/form-data with the image in the field `image_file` and the key in `x-api-key`, and
# read the answer's body as the PNG. The request below is built the way that sample builds it
# (http.client, a hand-made boundary), so the mock is held to the published shape.
import http.client  # noqa: E402
import uuid  # noqa: E402


def photoroom_segment(image, key="pr_test", field="image_file"):
    boundary = "----------" + uuid.uuid4().hex
    body = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field}\"; filename=\"photo.png\"\r\n"
        "Content-Type: image/png\r\n\r\n"
    ).encode() + image + f"\r\n--{boundary}--\r\n".encode()
    host = BASE.split("://", 1)[1]
    conn = http.client.HTTPConnection(host, timeout=10)
    headers = {"Content-Type": f"multipart/form-data; boundary={boundary}"}
    if key:
        headers["x-api-key"] = key
    conn.request("POST", "/v1/segment", body=body, headers=headers)
    r = conn.getresponse()
    return r.status, r.getheader("Content-Type"), r.read()


@check("photoroom segment (its published sample's request): a PNG with alpha, charged once; no image_file 400, no key 401")
def _():
    reset()
    # A product on a plain background: the corner's colour is the background.
    import struct, zlib  # noqa: E401
    w = h = 8
    rows = b"".join(b"\x00" + b"".join(
        (b"\xc8\x1e\x1e" if 2 <= x < 6 and 2 <= y < 6 else b"\xee\xee\xee") for x in range(w)) for y in range(h))
    chunk = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xffffffff)
    photo = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) + \
        chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")
    before = len([l for l in ledger() if l.get("endpoint") == "POST /v1/segment" and l.get("charged")])
    status, ctype, out = photoroom_segment(photo)
    assert status == 200 and ctype == "image/png", (status, ctype, out[:80])
    is_png(out)
    assert out[25] in (4, 6), "the cut-out carries alpha"
    after = len([l for l in ledger() if l.get("endpoint") == "POST /v1/segment" and l.get("charged")])
    assert after == before + 1, (before, after)
    status, _, out = photoroom_segment(photo, field="image")
    assert status == 400, (status, out[:120])
    status, _, _ = photoroom_segment(photo, key=None)
    assert status == 401, status
    assert len([l for l in ledger() if l.get("endpoint") == "POST /v1/segment" and l.get("charged")]) == after


@check("openai: an account out of credit is a 429 RateLimitError with code insufficient_quota")
def _():
    reset()
    behave(out_of_credit=True)
    try:
        oa.images.generate(model=MODEL, prompt="oa broke")
    except openai.RateLimitError as e:
        assert e.code == "insufficient_quota", e.code
    else:
        raise AssertionError("out of credit did not raise RateLimitError")
    assert charged("oa broke") == 0


@check("openai: 429s in each Retry-After form and with rate-limit headers parse as RateLimitError")
def _():
    for form in ("seconds", "fractional", "http_date", "retry_after_ms", "reset"):
        reset()
        behave(retry_after_ms=1500, retry_after_form=form, ratelimit_headers=True)
        try:
            oa.images.generate(model=MODEL, prompt="oa 429 " + form)
        except openai.RateLimitError as e:
            assert e.response.headers.get("x-ratelimit-remaining-requests") == "0", dict(e.response.headers)
        else:
            raise AssertionError(f"{form}: no RateLimitError")


@check("replicate: out of credit is a 402 ReplicateError; canceled and silent failures parse")
def _():
    reset()
    behave(out_of_credit=True)
    try:
        rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep broke"})
    except ReplicateError as e:
        assert e.status == 402, e.status
    else:
        raise AssertionError("out of credit was accepted")
    reset()
    behave(job_canceled=True, job_duration_ms=400)
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep canceled"})
    p.wait()
    assert p.status == "canceled" and p.error is None, p
    reset()
    behave(job_duration_ms=0, job_failure_logs="CUDA error: out of memory")
    p = rc.models.predictions.create(model="black-forest-labs/flux-schnell", input={"prompt": "rep silent"})
    p.wait()
    assert p.status == "failed" and p.error is None and "out of memory" in (p.logs or ""), p


@check("files: the result host answers 404/503 for the first downloads, then the image")
def _():
    reset()
    behave(openai_url_answers=True)
    r = oa.images.generate(model=MODEL, prompt="oa blip")
    behave(result_fetch_failures=2, result_fetch_status=503)
    codes = [httpx.get(r.data[0].url).status_code for _ in range(3)]
    assert codes == [503, 503, 200], codes


@check("fal: a final server error on the result, out of credit, and a 422 validation list")
def _():
    reset()
    behave(job_duration_ms=0, fal_result_not_retryable=True)
    h = fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal final"})
    assert isinstance(h.status(), fal_client.Completed)
    try:
        h.get()
    except fal_client.client.FalClientHTTPError as e:
        assert e.status_code == 500 and e.response.headers.get("x-fal-retryable") == "false", e
    else:
        raise AssertionError("a final server error's result was served")
    reset()
    behave(out_of_credit=True)
    try:
        fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal broke"})
    except fal_client.client.FalClientHTTPError as e:
        assert e.status_code == 403 and "Exhausted balance" in e.message, e
    else:
        raise AssertionError("out of credit was accepted")
    reset()
    try:
        fc.submit("fal-ai/flux/dev", arguments={"prompt": "fal 422", "num_inference_steps": 0})
    except fal_client.client.FalClientHTTPError as e:
        assert e.status_code == 422, e
    else:
        raise AssertionError("an out-of-range input was accepted")
    assert charged("fal broke") == 0 and charged("fal 422") == 0

# ---------------------------------------------------------------- Drafts (issue 36)
# A draft's structured output: a strict JSON schema (tally's own is domain::draft::response_schema).
DRAFT_SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["shots", "copy"],
    "properties": {
        "shots": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                  "required": ["role", "prompt"], "properties": {"role": {"type": "string"}, "prompt": {"type": "string"}}}},
        "copy": {"type": "object", "additionalProperties": False, "required": ["title"],
                 "properties": {"title": {"type": "string"}}},
    },
}
DRAFT_INPUT = 'INPUT = {"product": "cup", "facts": [{"key": "material", "value": "porcelain"}], "language": "en"}'


@check("openai responses.create(background=True, store=True, json_schema) answers an id at once; retrieve gives output_text and usage")
def _():
    reset()
    prompt = "oa draft " + DRAFT_INPUT
    r = oa.responses.create(
        model="gpt-5-mini",
        input=[{"role": "user", "content": [{"type": "input_text", "text": prompt},
                                            {"type": "input_image", "image_url": DATA_URI}]}],
        text={"format": {"type": "json_schema", "name": "tally_draft", "schema": DRAFT_SCHEMA, "strict": True}},
        background=True, store=True, max_output_tokens=2000,
    )
    assert r.id.startswith("resp_") and r.status in ("queued", "in_progress") and r.background, r
    end = time.time() + 10
    while r.status in ("queued", "in_progress") and time.time() < end:
        time.sleep(0.05)
        r = oa.responses.retrieve(r.id)
    assert r.status == "completed", r.status
    d = json.loads(r.output_text)
    assert d["shots"] and d["copy"]["title"] and any(f["value"] == "porcelain" for f in d["facts"]), d
    assert r.usage.input_tokens > 0 and r.usage.output_tokens > 0, r.usage
    lines = [l for l in ledger() if "responses" in l["endpoint"]]
    creates = [l for l in lines if l["endpoint"] == "POST /v1/responses"]
    assert len(creates) == 1 and creates[0]["charged"] and creates[0]["reference_images"] == 1, lines
    assert all(not l["charged"] for l in lines if l["endpoint"] != "POST /v1/responses"), lines


@check("openai responses: background without store, and an unknown id, are refused as the API refuses them")
def _():
    reset()
    try:
        oa.responses.create(model="gpt-5-mini", input="oa no store", background=True, store=False)
    except openai.BadRequestError:
        pass
    else:
        raise AssertionError("background without store was accepted")
    try:
        oa.responses.retrieve("resp_nosuch")
    except openai.NotFoundError:
        pass
    else:
        raise AssertionError("an unknown response id was found")
    assert charged("oa no store") == 0


@check("openai client at DashScope's compatible-mode path: chat.completions with json_schema, image_url parts, usage")
def _():
    reset()
    ds = openai.OpenAI(api_key="sk-ds-test", base_url=BASE + "/dashscope/compatible-mode/v1", max_retries=0)
    prompt = "ds draft " + DRAFT_INPUT
    r = ds.chat.completions.create(
        model="qwen-vl-max",
        messages=[{"role": "user", "content": [{"type": "text", "text": prompt},
                                               {"type": "image_url", "image_url": {"url": DATA_URI}}]}],
        response_format={"type": "json_schema",
                         "json_schema": {"name": "tally_draft", "schema": DRAFT_SCHEMA, "strict": True}},
        max_tokens=2000,
    )
    d = json.loads(r.choices[0].message.content)
    assert d["shots"] and d["copy"]["title"], d
    assert r.usage.prompt_tokens > 0 and r.usage.completion_tokens > 0, r.usage
    assert charged(prompt) == 1
    assert [l["reference_images"] for l in ledger() if l.get("prompt") == prompt] == [1]



@check("google-genai generate_content with response_mime_type application/json and response_schema: a JSON draft, usage")
def _():
    reset()
    prompt = "gm draft " + DRAFT_INPUT
    schema = gtypes.Schema(
        type=gtypes.Type.OBJECT, required=["shots", "copy"],
        properties={
            "shots": gtypes.Schema(type=gtypes.Type.ARRAY, items=gtypes.Schema(
                type=gtypes.Type.OBJECT, properties={"role": gtypes.Schema(type=gtypes.Type.STRING),
                                                     "prompt": gtypes.Schema(type=gtypes.Type.STRING)})),
            "copy": gtypes.Schema(type=gtypes.Type.OBJECT, properties={"title": gtypes.Schema(type=gtypes.Type.STRING)}),
        },
    )
    r = gm_beta.models.generate_content(
        model="gemini-2.5-flash",
        contents=[prompt, gtypes.Part.from_bytes(data=PNG, mime_type="image/png")],
        config=gtypes.GenerateContentConfig(response_mime_type="application/json", response_schema=schema,
                                            max_output_tokens=2000),
    )
    d = json.loads(r.text)
    assert d["shots"] and d["copy"]["title"], d
    assert r.usage_metadata.prompt_token_count > 0 and r.usage_metadata.candidates_token_count > 0
    assert charged(prompt) == 1

reset()
failed = [n for n, e in results if e is not None]
print(f"{len(results) - len(failed)} passed, {len(failed)} failed")
sys.exit(1 if failed else 0)
