"""How aiconfigurator-core's generator served the runs it benchmarked, read from a run's id.

Every run of the shipped training file is one: :func:`aiconfigurator_run` recognises its id,
:func:`aiconfigurator_server` fills in the server settings its generator deployed (token budget,
sequence limit, mixed batches, CUDA-graph batch sizes) where the row gives none
(docs/calibration.md, ``--served-by``).
"""

from __future__ import annotations

import re
from dataclasses import replace

from .serving_bench import BenchRow

#: Tokens aiconfigurator's generator adds to the prompt length (and the concurrency) for an
#: aggregated server's token budget; :func:`aiconfigurator_server` keeps them for SGLang only.
AIC_BUDGET_EXTRA = 1500
#: The first SGLang version whose aiconfigurator command line turns mixed chunks on.
AIC_SGLANG_MIXED_FROM = "0.5.6"


#: A run id as aiconfigurator-core's collector names an aggregated run:
#: ``…_agg_{isl}x{osl}_c{concurrency}_tp{tp}_ep…`` (some ids leave the concurrency out, ``_c_``).
AIC_RUN_ID = re.compile(r"_agg_(\d+)x(\d+)_c(\d*)_tp(\d+)(?!\d)")


def aiconfigurator_run(row: BenchRow) -> bool:
    """Whether ``row.source`` names an aiconfigurator-core collector run of the row's own prompt and
    output lengths, concurrency (where the id gives one) and GPU count: a run its generator deployed
    (:func:`aiconfigurator_server`), as every run of the shipped training file was."""
    m = AIC_RUN_ID.search(row.source)
    if m is None:
        return False
    isl, osl, conc, tp = m.groups()
    return (int(isl), int(osl), int(tp)) == (row.isl, row.osl, row.tp) and (not conc or int(conc) == row.concurrency)


def aiconfigurator_server(row: BenchRow) -> BenchRow:
    """``row`` with the server settings of an aggregated (one-replica) deployment that
    aiconfigurator-core benchmarked at ``concurrency`` clients, where the row sets none: at most
    ``concurrency`` requests running (vLLM ``max-num-seqs``, SGLang ``max-running-requests``,
    TensorRT-LLM ``max_batch_size``), CUDA graphs for every batch up to ``concurrency``, SGLang's
    mixed chunks from version 0.5.6 (the first whose command-line template passes
    ``--enable-mixed-chunk``), and a token budget per iteration: SGLang ``max-prefill-tokens``
    ``isl + 1500`` beside the running decodes, as the generator writes it; vLLM and TensorRT-LLM
    one prompt beside the decodes (``concurrency + isl``), which is how their runs behave, not
    the generator's ``concurrency + isl + 1500``; and vLLM's batches formed one iteration ahead
    (async scheduling). The last two are read from the runs (docs/calibration.md, "How the
    shipped runs were served")."""
    from .tables import version_key

    mixed = row.mixed_batches
    v = row.engine_version
    # An unnumbered version (empty, a build tag) says nothing about which template ran.
    if (
        mixed is None
        and row.engine == "sglang"
        and v[:1].isdigit()
        and version_key(v) >= version_key(AIC_SGLANG_MIXED_FROM)
    ):
        mixed = True
    return replace(
        row,
        max_num_seqs=row.max_num_seqs if row.max_num_seqs is not None else row.concurrency,
        max_num_batched_tokens=row.max_num_batched_tokens
        if row.max_num_batched_tokens is not None
        else row.concurrency + row.isl + (AIC_BUDGET_EXTRA if row.engine == "sglang" else 0),
        mixed_batches=mixed,
        schedule_ahead=True if row.schedule_ahead is None and row.engine == "vllm" else row.schedule_ahead,
        cuda_graph_max_batch=row.cuda_graph_max_batch if row.cuda_graph_max_batch is not None else row.concurrency,
    )
