"""Planning and running the sandwich witness <= Lip <= certified for every attention of a model.

An attention of a model is verified as a *kind*, the map whose Lipschitz constant is taken:

==================  ==========================================================================
kind                map (tokens are rows; queries ``Y`` (m, d), context ``X`` (n, d))
==================  ==========================================================================
``self``            ``X -> Att(X, X)``, self-attention of an encoder
``causal``          ``X -> Att(X, X)`` with row i attending to tokens 1..i (a decoder)
``cross-queries``   ``Y -> Att(Y, X)``, the context fixed anywhere in its domain
``cross-context``   ``X -> Att(Y, X)``, the queries fixed anywhere in their domain
``cross-joint``     ``(Y, X) -> Att(Y, X)``, both moving
==================  ==========================================================================

``--kind cross`` selects the three senses of cross-attention.  A :class:`Job` is one head (or
the whole multi-head layer, ``head`` None, ``sum_h head_h W_O^h + b_O``) of one layer of one
stack, in one kind.  Its inputs live in the image of the LayerNorm that feeds them
(:meth:`Verification.domains_of`): self-attention reads its layer's ``ln_in``; a decoder's
cross-attention reads its queries through the pre-cross-attention LayerNorm (``cross_norm``)
and its context, the encoder's output, through the encoder's final LayerNorm
(:attr:`Model.context_norm`).

:class:`Verification` plans the jobs (one per head, then the whole layer, per layer, kind and
stack), hands each to :func:`verify_job` as plain arrays -- in this process, in local worker
processes or on a dask cluster (:mod:`lipbound.numeric.scaleout`) -- and assembles each result
into its report row as it finishes, so a long run writes a partial report after every row and
keeps what finished when interrupted or when a job fails.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from types import SimpleNamespace
from typing import final

import numpy as np

from ..errors import AssumptionError
from ..rigorous.value import CertifiedValue
from ..symbolic.claims import CLAIMS
from .certify import head_bounds, head_constant, layer_bounds
from .dispatch import check_layer, dot_product_scope, head_facts
from .domains import DomainSpec, TokenBall, TokenDomain, domain_from_plain
from .evaluate import evaluate_bound
from .model import Head, Layer, Model, attention_arrays, attention_from_arrays
from .report import KINDS, HeadReport, ModelReport, refutations
from .scaleout import TaskFailed, run_all
from .witness import Witness, search_witness

__all__ = ["Job", "Verification", "verify_model", "verify_job", "KINDS", "KIND_CHOICES", "plan_jobs", "DEFAULT_BUDGET"]

#: Nominal seconds of witness search per head (twice per whole layer) unless asked: SmolLM2-135M's 30 blocks (270
#: heads, 30 layers) take about 1000 CPU-s at 4, 8-9 minutes with two workers; its head gaps are within 3% of those
#: at 10 but on block 0 (median 1.86 against 1.81, worst 2.26 against 2.10; docs/mathematics.md, section 14).
DEFAULT_BUDGET = 4.0

#: What ``--kind`` accepts: a kind, or ``cross`` for its three senses.
KIND_CHOICES = ("self", "causal", "cross") + KINDS[2:]
CROSS_KINDS = KINDS[2:]


@final
@dataclass(frozen=True)
class Job:
    """One row of the report: ``head`` of layer ``layer`` of stack ``block`` (None: the whole
    layer), in ``kind``."""

    block: str
    layer: int
    head: int | None
    kind: str

    @property
    def role(self) -> str:
        """The argument of the constant, as :mod:`lipbound.numeric.dispatch` names it."""
        return "self" if self.kind in ("self", "causal") else self.kind

    @property
    def cross(self) -> bool:
        return self.kind in CROSS_KINDS


def _expand(kinds) -> tuple[str, ...] | None:
    if kinds is None:
        return None
    if isinstance(kinds, str):
        kinds = (kinds,)
    chosen = []
    for kind in kinds:
        if kind not in KIND_CHOICES:
            raise AssumptionError("kind", f"one of {', '.join(KIND_CHOICES)}", repr(kind), "e.g. `kind` cross")
        chosen += list(CROSS_KINDS) if kind == "cross" else [kind]
    return tuple(dict.fromkeys(chosen))


def _kinds_of(model: Model, block: str, index: int) -> tuple[str, ...]:
    layer = model.layer(index, block)
    return (layer.self_kind,) + (CROSS_KINDS if layer.cross is not None else ())


def _offered(model: Model, blocks) -> str:
    """What each stack offers, for messages: ``encoder: self; decoder: causal, cross``."""
    parts = []
    for block in blocks:
        kinds = {k for index in model.stack(block) for k in _kinds_of(model, block, index)}
        shown = [k for k in ("self", "causal") if k in kinds] + (["cross"] if kinds & set(CROSS_KINDS) else [])
        parts.append(f"{block}: {', '.join(shown) or 'nothing loaded'}")
    return "; ".join(parts)


def plan_jobs(model: Model, *, blocks=None, layers=None, heads=None, kinds=None,
              whole_layers: bool = True) -> list[Job]:
    """The jobs for the selected stacks, layers, heads and kinds (each default: all), checked.

    Raises
    ------
    WeightsError, AssumptionError
        A stack, layer or head the model does not have; a kind no selected layer has (e.g.
        ``cross`` on an encoder, ``self`` on a causal decoder).
    """
    if isinstance(blocks, str):
        blocks = (blocks,)
    chosen_blocks = tuple(model.check_block(b) for b in blocks) if blocks is not None else model.blocks
    wanted = _expand(kinds)
    jobs: list[Job] = []
    for block in chosen_blocks:
        indices = sorted(model.stack(block)) if layers is None else \
            [model.layer(i, block).index for i in ([layers] if isinstance(layers, int) else layers)]
        for index in indices:
            layer = model.layer(index, block)
            for h in heads or ():
                model.head(index, h, block)  # a clear error before any work
            for kind in _kinds_of(model, block, index):
                if wanted is not None and kind not in wanted:
                    continue
                count = (layer.cross if kind in CROSS_KINDS else layer.attention).num_heads
                jobs += [Job(block, index, h, kind) for h in (range(count) if heads is None else heads)]
                if whole_layers and heads is None:
                    jobs.append(Job(block, index, None, kind))
    if not jobs:
        where = " and ".join(chosen_blocks)
        raise AssumptionError("kind", f"a kind the selected layers have ({_offered(model, chosen_blocks)})",
                              ", ".join(wanted or ()) or "nothing", f"pick one of those as `kind`, or another "
                              f"`block` than the {where}" if len(model.blocks) > 1 else "pick one of those as `kind`")
    return jobs


def _slug(name: str) -> str:
    return "".join(ch if ch.isalnum() or ch in "-_" else "-" for ch in name) or "model"


@final
class Verification:
    """The sandwich for every selected attention of a model, row by row.

    Parameters
    ----------
    model : Model
    blocks : str or list of str, optional
        Stacks to verify (``"encoder"``, ``"decoder"``; default all).
    layers, heads : list of int, optional
        Layers (of each selected stack) and heads to verify (counted from 0; default all).  The
        whole layer is verified when every head is (``whole_layers``).
    kinds : str or list of str, optional
        Kinds (see the module docstring; ``"cross"`` for its three senses; default every kind
        each layer has).
    n : int
        Tokens of self-attention; context tokens of cross-attention.
    m : int, optional
        Queries of cross-attention (default ``n``).
    domain : DomainSpec or str
        ``"layernorm"``, ``"layernorm-image"`` or a radius, resolved per attention against the
        LayerNorm that feeds it (both of them for cross-attention).
    sdp : bool
        Add the SDP relaxations.
    budget : float
        Nominal seconds of each head's witness search (twice that for a whole layer): a fixed
        amount of work (:mod:`lipbound.numeric.witness.clock`), so a seed gives the same numbers
        on any machine and in any worker (default :data:`DEFAULT_BUDGET`).
    drop_query_bias : bool
        Verify the heads without their query bias, the setting of published claims about plain
        dot-product attention (which are then listed and checked).
    """

    def __init__(self, model: Model, *, blocks=None, layers=None, heads=None, kinds=None, n: int = 8,
                 m: int | None = None, domain="layernorm", sdp: bool = False, budget: float = DEFAULT_BUDGET,
                 seed: int = 0, witness_dir: str | Path = "witnesses", whole_layers: bool = True,
                 drop_query_bias: bool = False):
        if not isinstance(model, Model):
            raise AssumptionError("model", "a lipbound.numeric.model.Model", type(model).__name__,
                                  "load one with load_weights(path)")
        self.model = model
        self.heads = None if heads is None else list(heads)
        self.jobs = plan_jobs(model, blocks=blocks, layers=layers, heads=self.heads, kinds=kinds,
                              whole_layers=whole_layers)
        has_cross = any(job.cross for job in self.jobs)
        if m is not None and not has_cross:
            raise AssumptionError("m", "no query count: only cross-attention has m queries besides n context tokens",
                                  f"m = {m} for {', '.join(sorted({job.kind for job in self.jobs}))} attention",
                                  "omit `m` (self-attention has n tokens), or ask for `kind` cross")
        self.n, self.m = n, (n if m is None else m) if has_cross else None
        self.sdp, self.budget, self.seed = sdp, budget, seed
        self.spec = DomainSpec.parse(domain)
        self.witness_dir = Path(witness_dir)
        self.drop_query_bias = drop_query_bias
        self._domains: dict = {}
        for job in self.jobs:
            target = self._target(job)       # a head or layer no theorem covers is refused before any work
            for head in (target,) if isinstance(target, Head) else target.heads:
                head_facts(head, job.role)
            check_layer(target)
        for job in self.jobs:
            self.domains_of(job)  # a clear error (no LayerNorm, no context) before any work
        groups = {}
        for job in self.jobs:
            context, queries = self.domains_of(job)
            groups[(job.block, job.layer, "cross" if job.cross else job.kind)] = _domain_text(context, queries)
        self.report = ModelReport(model.name, model.path, model.sha256, n, "fro", groups, planned=len(self.jobs),
                                  m=self.m, description=model.describe())

    def domains_of(self, job: Job) -> tuple[TokenDomain, TokenDomain | None]:
        """``(context domain, query domain)``: the domain of the tokens (self-attention) or of
        the context (cross-attention), and the queries' domain (None for self-attention)."""
        key = (job.block, job.layer, job.cross)
        if key not in self._domains:
            layer = self.model.layer(job.layer, job.block)
            where = f"layer {job.layer} of the {job.block}"
            if not job.cross:
                self._domains[key] = (self.spec.resolve(layer.ln_in, where), None)
            else:
                context = self.model.context_norm
                if context is None and self.spec.kind != "radius":
                    raise AssumptionError("domain", "a number, since no LayerNorm is known to feed the "
                                          "cross-attention's context (the encoder output)", repr(self.spec.kind),
                                          "give a radius R as the `domain`")
                self._domains[key] = (self.spec.resolve(context, f"the context of {where}"),
                                      self.spec.resolve(layer.cross_norm, f"the queries of {where}"))
        return self._domains[key]

    def run(self, on_row: Callable[[ModelReport, HeadReport], None] | None = None, *, jobs: int = 1,
            scheduler: str | None = None) -> ModelReport:
        """Verify every job; ``on_row(report, row)`` after each finished row.

        The jobs run through :func:`lipbound.numeric.scaleout.run_all`: in this process
        (``jobs=1``), in ``jobs`` local processes, or on the dask cluster at ``scheduler``.  Each
        job travels as plain arrays (:func:`verify_job`) and its result is assembled here into
        the report row, so every way gives the same rows.  ``report.rows`` lists the finished
        rows in the order of :attr:`jobs`.  If a job raises, the rows that finished stay in the
        report (``complete`` False) and the job's exception propagates; so do they when the run is interrupted
        (KeyboardInterrupt), head rows that waited for their layer's job included.
        """
        began = time.perf_counter()
        self.witness_dir.mkdir(parents=True, exist_ok=True)
        finished: dict[int, HeadReport] = {}
        # a head whose whole layer is verified takes its "derived" constant from the layer's job, which
        # evaluates every head's: its row waits for that job
        layer_of = self._layer_jobs()
        # in parallel, the whole layers (several times a head's work) start first, so that no long
        # job is left alone at the end; serially, each layer's whole job just before the heads that wait for
        # it (in the planned order no row would be written until the layer's job, and Ctrl-C during it would
        # keep none)
        order = list(range(len(self.jobs)))
        if jobs != 1 or scheduler is not None:
            order.sort(key=lambda i: self.jobs[i].head is not None)
        else:
            order.sort(key=lambda i: (layer_of.get(i, i), self.jobs[i].head is not None))
        layers_done: dict[int, dict] = {}
        waiting: dict[int, list[tuple[int, dict]]] = {}

        def finish(index: int, result: dict, derived: CertifiedValue | None = None) -> None:
            if index in layer_of and derived is None:
                head = self.jobs[index].head
                derived = CertifiedValue.from_json(layers_done[layer_of[index]]["head_derived"][head])
            row = self.assemble(self.jobs[index], result, derived)
            finished[index] = row
            self.report.rows = [finished[i] for i in sorted(finished)]
            self.report.seconds = time.perf_counter() - began
            if on_row is not None:
                on_row(self.report, row)

        def arrived(done: int, total: int, position: int, result: dict) -> None:
            index = order[position]
            if index in layer_of and layer_of[index] not in layers_done:
                waiting.setdefault(layer_of[index], []).append((index, result))
                return
            finish(index, result)
            if self.jobs[index].head is None:
                layers_done[index] = result
                for head_index, head_result in waiting.pop(index, []):
                    finish(head_index, head_result)

        try:
            tasks = [self.task(self.jobs[i], derived=False) if i in layer_of else self.task(self.jobs[i])
                     for i in order]
            run_all(verify_job, tasks, jobs=jobs, scheduler=scheduler, progress=arrived)
        except (TaskFailed, KeyboardInterrupt) as stopped:
            # their layer failed or was interrupted: the finished heads' rows are kept, each with its own constant
            for head_index, head_result in [item for items in waiting.values() for item in items]:
                finish(head_index, head_result, self._head_derived(self.jobs[head_index]))
            self.report.seconds = time.perf_counter() - began
            if isinstance(stopped, KeyboardInterrupt):
                raise
            raise stopped.error from None
        self.report.complete = True
        self.report.seconds = time.perf_counter() - began
        return self.report

    def _target(self, job: Job) -> Head | Layer:
        layer = self.model.layer(job.layer, job.block)
        attention = layer.cross if job.cross else layer.attention
        if job.head is None:
            return attention
        head = attention.heads[job.head]
        return replace(head, b_Q=np.zeros(head.d_k)) if self.drop_query_bias else head

    def _layer_jobs(self) -> dict[int, int]:
        """Head job -> the planned job of its whole layer, for the heads whose ``"derived"`` constant that job
        evaluates (all but heads verified without their query bias, which the layer keeps)."""
        layers = {(job.block, job.layer, job.kind): i for i, job in enumerate(self.jobs) if job.head is None}
        if self.drop_query_bias:
            return {}
        return {i: layers[(job.block, job.layer, job.kind)] for i, job in enumerate(self.jobs)
                if job.head is not None and (job.block, job.layer, job.kind) in layers}

    def _head_derived(self, job: Job) -> CertifiedValue:
        """The ``"derived"`` constant of a head job, evaluated here."""
        domain, query_domain = self.domains_of(job)
        return head_constant(self._target(job), "fro", domain, self.n, m=self.m if job.cross else None,
                             role=job.role, query_domain=query_domain)

    def task(self, job: Job, derived: bool = True) -> tuple:
        """The arguments of :func:`verify_job` for ``job``: plain arrays, numbers and strings (``derived``
        False: a head job leaves its ``"derived"`` constant to its layer's job)."""
        domain, query_domain = self.domains_of(job)
        model = self.model
        return (attention_arrays(self._target(job)), domain.plain(), None if query_domain is None else
                query_domain.plain(), self.n, self.m if job.cross else None, job.role, job.kind, self.sdp,
                self.budget * (2 if job.head is None else 1), self.seed,
                (model.name, model.path or "", model.sha256 or ""), job.block, job.layer, job.head, derived)

    def assemble(self, job: Job, result: dict, derived: CertifiedValue | None = None) -> HeadReport:
        """The report row of ``job`` from what :func:`verify_job` returned; saves the witness.  ``derived``:
        the head's ``"derived"`` constant when its job left it out (it comes first among the bounds)."""
        m = self.m if job.cross else None
        domain, query_domain = self.domains_of(job)
        witness = Witness.from_arrays(result["witness"])
        self.witness_dir.mkdir(parents=True, exist_ok=True)
        name = "all" if job.head is None else f"H{job.head}"
        size = f"n{self.n}" + (f"-m{m}" if m is not None else "")
        path = witness.save(self.witness_dir / f"{_slug(self.model.name)}-{job.block}-L{job.layer}-{job.kind}-{name}-"
                                               f"{size}.npz")
        bounds = [CertifiedValue.from_json(bound) for bound in result["bounds"]]
        if derived is not None:
            bounds.insert(0, derived)
        row = HeadReport(job.layer, job.head, _domain_text(domain, query_domain), self.n, witness.value, str(path),
                         witness.method, bounds, block=job.block, kind=job.kind, m=m)
        refutations(row)
        return row


def verify_job(target: dict, domain: dict, query_domain: dict | None, n: int, m: int | None, role: str, kind: str,
               sdp: bool, budget: float, seed: int, origin: tuple[str, str, str], block: str, layer: int,
               head: int | None, derived: bool = True) -> dict:
    """One row's work, from plain data to plain data, wherever it runs (a worker process too).

    Parameters
    ----------
    target : dict
        The head or layer as :func:`~lipbound.numeric.model.attention_arrays`.
    domain, query_domain : dict
        :meth:`~lipbound.numeric.domains.TokenDomain.plain` of the tokens' (the context's) and the
        queries' domains (None for self-attention).
    n, m, role, kind, sdp, budget, seed
        As for :func:`~lipbound.numeric.witness.search_witness` and
        :func:`~lipbound.numeric.certify.head_bounds`; ``budget`` in nominal seconds of work.
    origin : (name, path, sha256)
        The weights, recorded in the witness.
    block, layer, head : str, int, int or None
        Where the target sits in the model.
    derived : bool
        A head: evaluate its ``"derived"`` constant (False: its whole layer's job returns it).

    Returns
    -------
    dict
        ``{"witness": Witness.to_arrays(), "bounds": [CertifiedValue.to_json(), ...]}``, and for a whole
        layer ``"head_derived"``: every head's ``"derived"`` constant (the layer's is composed from them),
        as JSON; any cvxpy problem or SymPy expression is built and dropped here.
    """
    target_map = attention_from_arrays(target)
    context = domain_from_plain(domain)
    queries = None if query_domain is None else domain_from_plain(query_domain)
    name, path, sha256 = origin
    witness = search_witness(target_map, domain=context, n=n, budget_seconds=budget, seed=seed,
                             origin=SimpleNamespace(name=name, path=path, sha256=sha256), layer=layer, head=head,
                             block=block, role=role, m=m, query_domain=queries)
    options = dict(role=role, m=m, query_domain=queries, sdp=sdp)
    if head is None:
        for one in target_map.heads:
            head_facts(one, role)            # what no theorem covers is refused as layer_bounds refuses it
        per_head = [head_constant(h, "fro", context, n, role=role, m=m, query_domain=queries)
                    for h in target_map.heads]
        bounds = layer_bounds(target_map, context, n, per_head=per_head, **options)
        return {"witness": witness.to_arrays(), "bounds": [bound.to_json() for bound in bounds],
                "head_derived": [value.to_json() for value in per_head]}
    bounds = head_bounds(target_map, context, n, derived=derived, **options)
    if kind == "self":
        bounds += _claims(target_map, context, n)
    return {"witness": witness.to_arrays(), "bounds": [bound.to_json() for bound in bounds]}


def _domain_text(domain: TokenDomain, query_domain: TokenDomain | None) -> str:
    if query_domain is None:
        return domain.describe()
    return f"queries: {query_domain.describe()}; context: {domain.describe()}"


def _claims(head: Head, domain: TokenDomain, n: int) -> list[CertifiedValue]:
    """Published claims whose hypotheses the head meets, evaluated for comparison (never a best bound)."""
    if not (isinstance(domain, TokenBall) and domain.center is None and dot_product_scope(head)
            and not np.any(head.b_Q) and not head.causal):
        return []  # the claims state dot-product self-attention without query bias on a ball about 0
    claim = CLAIMS["castin-theorem"]
    value = evaluate_bound(claim.statement, head, domain, n, name=claim.key)
    return [value.renamed(claim.key, provenance=claim.provenance, proven=claim.is_theorem)]


def verify_model(model: Model, **options) -> ModelReport:
    """Run a :class:`Verification` to the end (``progress`` is called with each finished row;
    ``jobs`` and ``scheduler`` as for :meth:`Verification.run`)."""
    progress = options.pop("progress", None)
    how = {key: options.pop(key) for key in ("jobs", "scheduler") if key in options}
    return Verification(model, **options).run(None if progress is None else (lambda report, row: progress(row)),
                                               **how)
