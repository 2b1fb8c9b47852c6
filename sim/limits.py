"""Ranges a real deployment could have, for every scenario knob, and the sizes an input file may have.

Each bound lies far beyond any real deployment (the longest published context windows, the
largest clusters, request rates of a whole fleet) and far inside what the simulator computes
with finite numbers in bounded memory: a value outside is refused when the scenario is loaded
(:class:`sim.errors.ConfigError` naming the key and its range), never in the engine's hot path.
``docs/scenario.md`` ("Allowed ranges") lists the range of every key; a test holds it to the
schema.
"""

from __future__ import annotations

#: Tokens of one prompt, output, context or batch: 16,777,216 (the longest published context
#: windows are 10M tokens).
MAX_TOKENS = 2**24
#: Requests of one run (10M: ten times the 1M-request benchmark; arrays of 8 bytes per request).
MAX_REQUESTS = 10_000_000
#: Requests per second, and the smallest rate (one request in about 11.6 days).
MAX_RATE = 1e6
MIN_RATE = 1e-6
#: Seconds of simulated time for any duration or pause (about 31.7 years).
MAX_TIME_S = 1e9
#: Shortest sampling or checking period (seconds): a period of 1e-9 s would schedule a billion
#: events per simulated second.
MIN_PERIOD_S = 1e-3
#: Bytes of host or device memory a knob may name (1 PiB).
MAX_BYTES = 2**50
#: Seeds are stored as int64 (the sweep dataset's ``seed`` column).
MAX_SEED = 2**63 - 1
#: Gamma arrivals: coefficient of variation of the gaps.
MIN_CV, MAX_CV = 1e-3, 100.0
#: Lognormal lengths: sigma of the log (exp(10 · 6σ) is still a finite double).
MAX_SIGMA = 10.0
#: Mixture outliers: multiplier of the base lengths.
MAX_MULTIPLIER = 1e4
#: Trace replay: arrival times are multiplied by this.
MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-6, 1e6
#: Replicas, sequences per batch, shared-prefix groups.
MAX_REPLICAS = 4096
MAX_SEQS = 2**20
MAX_GROUPS = 1_000_000
#: Distinct shared-prefix tokens (``prefix_tokens × groups``): each 16 tokens become one id
#: kept for the run (64M tokens ≈ 4M ids).
MAX_PREFIX_TOKENS_TOTAL = 2**26
#: Model dims (a model far larger than any published one still computes with finite numbers).
MAX_LAYERS = 4096
MAX_DIM = 2**20
MAX_HEADS = 2**14
MAX_VOCAB = 2**24
MAX_PARAMS = 1e16
#: Roofline efficiencies: the smallest fraction of peak FLOP/s or bandwidth a device reaches
#: (1e-308 would price a step at infinity).
MIN_EFFICIENCY = 1e-3
#: Cost-model knobs: seconds per step and per sequence, and the paged-attention overhead factor.
MAX_STEP_OVERHEAD_S = 10.0
MAX_PER_SEQ_OVERHEAD_S = 1.0
MAX_OVERHEAD_FACTOR = 100.0

#: Sweeps: points (axes × seeds) and replicates; worker processes of a sweep or plan.
MAX_SWEEP_POINTS = 10_000
MAX_SWEEP_SEEDS = 10_000
MAX_WORKERS = 256

#: Input files: text files (scenario, sweep, profile, JSONL trace) and trace rows. A trace's row
#: count is read from its metadata (Parquet) or while streaming (CSV, JSONL), before anything is
#: held in memory.
MAX_TEXT_BYTES = 64 * 2**20
MAX_TRACE_ROWS = MAX_REQUESTS
#: Bytes a CSV trace may expand to once decompressed and parsed (1 GiB).
MAX_TRACE_BYTES = 2**30
#: Nesting of any YAML or JSON document (the deepest real scenario, a mixture of mixtures, has a
#: handful of levels) and the values a YAML document may hold once its aliases are expanded.
MAX_NESTING = 64
MAX_YAML_VALUES = 1_000_000
#: Characters of a value quoted in an error message.
MAX_QUOTED_CHARS = 400
