"""The routes, built by ``create_app``; each one calls the library function its CLI command calls."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from pydantic import ValidationError

from vramplan.catalog.hub import HubOptions
from vramplan.errors import Problem, ScenarioError, VramplanError
from vramplan.web.common import WebSettings, dumps, problems_json, pydantic_problems, zip_files
from vramplan.web.requests import KvRequest, PlanRequest, check_model, check_scenario, kv_document

_Req = TypeVar("_Req", KvRequest, PlanRequest)

__all__ = ["build_app", "serve_document"]

STATIC = Path(str(resources.files("vramplan.web").joinpath("static")))


class _TooLarge(Exception):
    pass


class _BadBody(Exception):
    pass


def _json(doc: Any, status: int = 200) -> Response:
    return Response(dumps(doc), status_code=status, media_type="application/json")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


async def _body(request: Request, limit: int) -> Any:
    """The request's JSON body, read up to ``limit`` bytes (a longer body is refused unread)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _TooLarge
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _TooLarge
        chunks.append(chunk)
    try:
        # NaN and Infinity are not JSON (RFC 8259), though Python's parser takes them
        return json.loads(b"".join(chunks) or b"null", parse_constant=_not_json)
    except ValueError as exc:
        raise _BadBody(f"the body is not JSON: {exc}") from None


def build_app(settings: WebSettings) -> FastAPI:
    # no Swagger or ReDoc pages: they load their scripts from a CDN, and the server must work offline
    app = FastAPI(title="vramplan", docs_url=None, redoc_url=None, openapi_url="/api/openapi.json")

    async def run(fn: Callable[[], Any]) -> Any:
        # the library is synchronous: a worker thread, abandoned (answering 503) past the time limit
        with anyio.fail_after(settings.time_limit_s):
            return await anyio.to_thread.run_sync(fn, abandon_on_cancel=True)

    @app.middleware("http")
    async def _server_timing(request: Request, call_next: Callable[[Request], Any]) -> Response:
        # the server's own time per request (W3C Server-Timing), read by benchmarks/bench_web.py
        t0 = time.perf_counter()
        response: Response = await call_next(request)
        response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - t0) * 1e3:.3f}"
        return response

    @app.exception_handler(VramplanError)
    async def _vramplan_error(_: Request, exc: VramplanError) -> Response:
        return _json({"detail": problems_json(exc)}, 422)

    @app.exception_handler(_TooLarge)
    async def _too_large(_: Request, exc: _TooLarge) -> Response:
        return _json({"detail": [{"where": "", "message": f"the body is over {settings.max_body_bytes:,} bytes",
                                  "hint": "send a scenario and at most one config.json", "text": ""}]}, 413)

    @app.exception_handler(_BadBody)
    async def _bad_body(_: Request, exc: _BadBody) -> Response:
        return _json({"detail": [{"where": "", "message": str(exc), "hint": "", "text": str(exc)}]}, 400)

    @app.exception_handler(TimeoutError)
    async def _timeout(_: Request, exc: TimeoutError) -> Response:
        msg = f"the computation took longer than {settings.time_limit_s:g} s"
        return _json({"detail": [{"where": "", "message": msg, "hint": "ask for a smaller search", "text": msg}]}, 503)

    # the Hub's address: the server's setting, else HF_ENDPOINT, else huggingface.co (catalog/hub.py)
    hub = HubOptions(endpoint=settings.hub_url) if settings.allow_hub else None

    async def scenario_of(request: Request) -> dict[str, Any]:
        doc = await _body(request, settings.max_body_bytes)
        checked: dict[str, Any] = await run(lambda: check_scenario(doc, hub))  # a thread: reading the Hub blocks
        return checked

    async def request_of(request: Request, model: type[_Req]) -> _Req:
        """A kv or plan request body: read bounded, validated, its model checked (a thread: the Hub blocks)."""
        raw = await _body(request, settings.max_body_bytes)
        try:
            q = model.model_validate(raw)
        except ValidationError as exc:
            raise pydantic_problems(exc) from None
        checked = await run(lambda: check_model(q.model, hub=hub))
        return q.model_copy(update={"model": checked})

    @app.get("/healthz")
    async def healthz() -> Response:
        from vramplan import __version__

        return _json({"status": "ok", "version": __version__, "hub": settings.allow_hub})

    @app.get("/api/schema")
    async def schema() -> Response:
        from vramplan.spec.scenario import Scenario

        return _json(Scenario.model_json_schema())

    @app.get("/api/models")
    async def models(q: str | None = None) -> Response:
        from vramplan.catalog.models import list_models

        # `vramplan models --json`
        return _json([{"id": r.id, "aliases": list(r.aliases), "source": r.source, "revision": r.revision}
                      for r in list_models(q)])

    @app.get("/api/gpus")
    async def gpus(q: str | None = None) -> Response:
        from vramplan.catalog.gpus import list_gpus

        return _json([asdict(g) for g in list_gpus(q)])  # `vramplan gpus --json`

    @app.post("/api/estimate")
    async def estimate(request: Request, remedies: bool = True) -> Response:
        from vramplan.engine import estimate as run_estimate
        from vramplan.plan.remedies import remedies_and_defaults

        doc = await scenario_of(request)

        def go() -> dict[str, Any]:
            # the CLI's --json document: the report, and for a job that is not FITS its remedies (each one a
            # further estimate: ``remedies=false`` leaves that search out, for a script that reads the verdict only)
            report = run_estimate(doc)
            return {**report.to_json_dict(), **(remedies_and_defaults(report, doc) if remedies else {})}

        return _json(await run(go))

    @app.post("/api/fit")
    async def fit(request: Request, counts: str | None = None, smallest: bool = False) -> Response:
        from vramplan.plan.every_gpu import SMALLEST_COUNTS, fit_on_every_gpu, smallest_fitting_counts
        from vramplan.plan.search import parse_gpu_counts

        doc = await scenario_of(request)
        wanted = parse_gpu_counts(counts) if counts else None
        if wanted is not None and len(wanted) > 8:
            raise ScenarioError([Problem("counts", f"{len(wanted)} GPU counts is more than this server tries at once",
                                         "give at most 8, e.g. 1,2,4,8")])
        if smallest:
            # each GPU's smallest count (of those asked, default 1, 2, 4, 8) that FITS
            rows = await run(lambda: smallest_fitting_counts(doc, wanted or SMALLEST_COUNTS))
        else:
            rows = await run(lambda: fit_on_every_gpu(doc, wanted))
        return _json([r.to_json_dict() for r in rows])

    @app.post("/api/compare")
    async def compare(request: Request) -> Response:
        from vramplan.compare import MIN_SETUPS
        from vramplan.compare import compare as run_compare

        docs = await _body(request, settings.max_body_bytes)
        if not isinstance(docs, list) or not MIN_SETUPS <= len(docs) <= settings.max_compare:
            raise ScenarioError([Problem("scenarios", f"give a list of {MIN_SETUPS} to {settings.max_compare} scenarios",
                                         "")])

        def go() -> dict[str, Any]:
            from vramplan.catalog.resolve import resolve

            # each setup checked on its own first, so that a problem names its setup: "1.train.seq_len"
            for i, d in enumerate(docs):
                try:
                    docs[i] = check_scenario(d, hub)
                    resolve(docs[i])
                except ScenarioError as exc:
                    raise ScenarioError([Problem(f"{i}.{p.where}", p.message, p.hint) for p in exc.problems]) from None
            return run_compare(docs, engine="analytic")

        return _json(await run(go))

    @app.post("/api/serve")
    async def serve(request: Request, subtract_cudagraphs: bool = False) -> Response:
        doc = _serve_doc(await scenario_of(request))
        return _json(await run(lambda: serve_document(doc, subtract_cudagraphs)))

    @app.post("/api/serve/curve")
    async def serve_curve(request: Request) -> Response:
        from vramplan.catalog.resolve import resolve
        from vramplan.serve.curve import concurrency_curve

        doc = _serve_doc(await scenario_of(request))
        points = await run(lambda: concurrency_curve(resolve(doc)))
        return _json([asdict(p) for p in points])

    @app.post("/api/generate")
    async def generate(request: Request) -> Response:
        from vramplan.analytic.generate import generate_step
        from vramplan.catalog.resolve import resolve
        from vramplan.engine import estimate as run_estimate
        from vramplan.plan.solvers import max_batch_size, max_prompt_len

        doc = {**await scenario_of(request), "task": "inference"}

        def go() -> dict[str, Any]:
            r = resolve(doc)
            report = run_estimate(r)
            # the document of `vramplan generate --json` (cli/serve_cmd.py)
            return {"report": report.to_json_dict(), "phases": {mo.phase: mo.total for mo in generate_step(r).moments},
                    "max_batch_size": max_batch_size(r), "max_prompt_len": max_prompt_len(r)}

        return _json(await run(go))

    @app.post("/api/kv")
    async def kv(request: Request) -> Response:
        q = await request_of(request, KvRequest)
        return _json(await run(lambda: kv_document(q)))

    @app.post("/api/solve/{kind}")
    async def solve(kind: str, request: Request, margin: float = 0.10) -> Response:
        from vramplan.plan.solvers import solve as run_solve

        kinds = ("max-batch", "max-seq", "min-gpus")
        if kind not in kinds:
            raise ScenarioError([Problem("KIND", f"unknown solver {kind!r}", f"use one of {kinds}")])
        if not 0 <= margin < 0.9:
            raise ScenarioError([Problem("--margin", f"{margin} is outside [0, 0.9)", "e.g. 0.1")])
        doc = await scenario_of(request)
        return _json((await run(lambda: run_solve(kind, doc, margin))).to_json_dict())

    async def plan_of(request: Request) -> Any:
        from vramplan.plan import ServeJob, TrainJob
        from vramplan.plan import plan as run_plan
        from vramplan.plan.search import parse_gpu_counts
        from vramplan.plan.steptime import PerfAssumptions

        p = await request_of(request, PlanRequest)
        counts = parse_gpu_counts(p.num_gpus)
        if len(counts) > settings.max_plan_counts:
            # an abandoned search keeps its thread busy: the search's size is bounded before it starts
            raise ScenarioError([Problem("num_gpus", f"{len(counts)} GPU counts is more than this server plans at once",
                                         f"give at most {settings.max_plan_counts}, e.g. 1-8 or 8,16,32,64")])
        job: TrainJob | ServeJob
        if p.task == "train":
            if p.seq_len is None:
                raise ScenarioError([Problem("seq_len", "no sequence length given", "pass --seq-len TOKENS")])
            job = TrainJob(seq_len=p.seq_len, global_batch=p.global_batch, global_batch_tokens=p.global_batch_tokens,
                           peft=p.peft, lora_rank=p.lora_rank, lora_alpha=p.lora_alpha,
                           allow_pure_bf16=p.allow_pure_bf16, max_micro_batch=p.max_micro_batch)
        else:
            if p.max_model_len is None:
                raise ScenarioError([Problem("max_model_len", "no max_model_len given", "pass --max-model-len TOKENS")])
            job = ServeJob(max_model_len=p.max_model_len, concurrency=p.concurrency,
                           allow_quantization=p.allow_quantization)
        perf = PerfAssumptions(mfu=p.mfu, inter_node_bytes_per_s=p.inter_node_gbps * 1e9)
        return await run(lambda: run_plan(p.model, p.gpu, p.num_gpus, job, margin=p.margin, top=p.top,
                                          assumptions=perf, gpus_per_node=p.gpus_per_node,
                                          host_memory_gib=p.host_memory_gib))

    @app.post("/api/plan")
    async def plan(request: Request) -> Response:
        return _json((await plan_of(request)).to_json_dict())

    @app.post("/api/plan/export.zip")
    async def plan_export(request: Request) -> Response:
        from vramplan.export import export_files

        res = await plan_of(request)
        if res.chosen is None:
            raise ScenarioError([Problem("plan", "nothing fits, so there is nothing to export",
                                         "see the plan's explanation")])
        files = export_files(res)
        return Response(zip_files(files), media_type="application/zip",
                        headers={"Content-Disposition": 'attachment; filename="vramplan-export.zip"'})

    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/")
    async def page() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.exception_handler(404)
    async def _not_found(_: Request, exc: Any) -> JSONResponse:
        return JSONResponse({"detail": [{"where": "", "message": "no such page", "hint": "", "text": ""}]}, 404)

    return app


def serve_document(doc: dict[str, Any], subtract_cudagraphs: bool = False) -> dict[str, Any]:
    """The document of ``vramplan serve --json``: the same library calls (``serve.report.serve_outcome`` and
    ``serve_document``) on the resolved scenario."""
    from vramplan.catalog.resolve import resolve
    from vramplan.serve.report import serve_document as document
    from vramplan.serve.report import serve_outcome

    return document(serve_outcome(resolve(doc), subtract_cudagraphs=subtract_cudagraphs))


def _serve_doc(doc: dict[str, Any]) -> dict[str, Any]:
    """``task: serve``, and the GPU count from ``parallel.tp`` when none is given, as ``vramplan serve`` does."""
    doc = {**doc, "task": "serve"}
    hw = dict(doc.get("hardware") or {})
    tp = (doc.get("parallel") or {}).get("tp") if isinstance(doc.get("parallel"), dict) else None
    if "num_gpus" not in hw and tp:
        doc["hardware"] = {**hw, "num_gpus": tp}
    return doc
