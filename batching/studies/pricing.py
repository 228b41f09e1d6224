"""One price for one deployment, on every surface (``capacity``, ``search``, the Capacity page, Find a deployment,
``report``): what the fleet that serves the target traffic costs per million output tokens.

- **At the target traffic** (the headline figure): the fleet's $ per hour (its nodes x GPUs per node x $ per
  GPU-hour) over the output tokens it serves per hour at the target, target req/s x mean output tokens x 3600.
  The tokens are the steady state the target carries, not a simulated throughput, which counts the drain of the
  queue after the last arrival and so understates the tokens an hour.
- **At capacity** (a second, labelled figure): one copy of the configuration (a node's replicas, or a
  prefill/decode split) run at the highest rate that meets the SLOs, with no headroom: the floor the price
  approaches as traffic fills whole nodes.

Default prices per GPU-hour are one table, ``batching/data/gpu_hour_usd.csv`` (cited and dated, one row a GPU);
``BATCHING_GPU_PRICES`` names another file of the same columns to replace it for a whole server. Every surface
also takes an explicit price, which wins.

The headroom (a node is planned to carry 1 / headroom of the rate the simulator finds it sustains) has one
default, ``DEFAULT_HEADROOM``, on every surface.
"""
from __future__ import annotations

import csv
import io
import math
import os
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

PRICES_FILE = Path(__file__).resolve().parents[1] / "data" / "gpu_hour_usd.csv"
PRICES_ENV = "BATCHING_GPU_PRICES"
MAX_GPU_HOUR_USD = 1e6

# The cost model's known error (docs/CALIBRATION.md, "End to end"): the simulated median TPOT of Llama-3.1-70B on
# 4xH100 is 17 % to 27 % below published vLLM and SGLang runs, so a real node sustains about 0.73 to 0.83 of the
# simulated rate: 1 / (1 - error) = 1.2 to 1.37. The default lies inside that range.
DEFAULT_HEADROOM = 1.25


@dataclass(frozen=True)
class GpuPrice:
    gpu: str
    usd_per_gpu_hour: float
    as_of: str
    source: str


MAX_TABLE_BYTES = 1 << 20  # the shipped table is under 2 KB
MAX_SHOWN = 60  # characters of a cell a message quotes


class PriceTableError(ValueError):
    """The price table cannot be read: one line naming the file and the row (header: row 1)."""


def _cell(value, most: int = MAX_SHOWN) -> str:
    text = str(value)
    return repr(text if len(text) <= most else text[:most] + "...") + (
        f" ({len(text):,} characters)" if len(text) > most else "")


def _where(path: Path) -> str:
    """The file in a message: with the variable's name when it came from ``BATCHING_GPU_PRICES``."""
    shown = _cell(str(path), 200)
    return f"{PRICES_ENV} {shown}" if os.environ.get(PRICES_ENV) == str(path) else f"price table {shown}"


def _read(path: Path) -> dict[str, GpuPrice]:
    """The table at ``path``; a PriceTableError of one line naming the file and row for anything wrong with it."""
    where = _where(path)

    def fail(what: str) -> PriceTableError:
        return PriceTableError(f"{where}: {what}")

    try:
        if path.is_dir():
            raise fail("a folder, not a CSV file (gpu,usd_per_gpu_hour,as_of,source)")
        if not path.exists():
            raise fail("no such file")
        if path.stat().st_size > MAX_TABLE_BYTES:
            raise fail(f"{path.stat().st_size:,} bytes; a price table is at most {MAX_TABLE_BYTES:,}")
        data = path.read_bytes()
    except OSError as exc:
        raise fail(f"cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        row = data[:exc.start].count(b"\n") + 1
        raise fail(f"row {row}: not UTF-8 text (byte 0x{data[exc.start:exc.start + 1].hex()}); save it as UTF-8") \
            from None
    if "\0" in text:
        raise fail(f"row {text[:text.index(chr(0))].count(chr(10)) + 1}: a NUL byte; a price table is text")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        rows = list(reader)
    except csv.Error as exc:  # a field over csv's limit (128 KB), a bad quote...
        raise fail(f"row {reader.reader.line_num}: not CSV ({exc})") from None
    missing = [c for c in ("gpu", "usd_per_gpu_hour") if c not in (reader.fieldnames or ())]
    if missing:
        raise fail(f"row 1: no column {' or '.join(missing)}; the header is gpu,usd_per_gpu_hour,as_of,source")
    out = {}
    for i, row in enumerate(rows, start=2):
        raw = row.get("usd_per_gpu_hour")
        try:
            usd = float(str(raw).strip()) if isinstance(raw, str) else math.nan
        except ValueError:
            raise fail(f"row {i}: usd_per_gpu_hour={_cell(raw)} is not a number; allowed > 0 to "
                       f"{MAX_GPU_HOUR_USD:g}") from None
        if not (math.isfinite(usd) and 0 < usd <= MAX_GPU_HOUR_USD):
            what = "is out of range" if math.isfinite(usd) else "is not a finite number"
            raise fail(f"row {i}: usd_per_gpu_hour={_cell(raw)} {what}; allowed > 0 to {MAX_GPU_HOUR_USD:g}")
        gpu = (row.get("gpu") or "").strip()
        if not gpu:
            raise fail(f"row {i}: gpu is empty; give a GPU preset name, e.g. h100-sxm")
        out[gpu] = GpuPrice(gpu, usd, str(row.get("as_of") or "").strip()[:MAX_SHOWN],
                            str(row.get("source") or "").strip()[:1000])
    return out


@lru_cache(maxsize=4)
def _table(path: str) -> dict[str, GpuPrice]:
    return _read(Path(path))


def table_path() -> Path:
    """The price table in use: ``BATCHING_GPU_PRICES``, else the shipped one."""
    return Path(os.environ.get(PRICES_ENV) or str(PRICES_FILE))


def price_table() -> dict[str, GpuPrice]:
    """The default $ per GPU-hour of each GPU preset (``BATCHING_GPU_PRICES`` or the shipped table); a
    PriceTableError (a ValueError of one line naming the file and row) when it cannot be read."""
    return _table(str(table_path()))


def table_problem() -> str | None:
    """Why the price table cannot be read (``price_table``'s error), or None."""
    try:
        price_table()
    except PriceTableError as exc:
        return str(exc)
    return None


def default_gpu_hour_usd(gpu: str) -> float:
    """The default price of one GPU-hour of ``gpu`` (a GPU preset name), or ValueError naming the GPUs priced."""
    table = price_table()
    if gpu not in table:
        raise ValueError(f"gpu={gpu!r} has no default price; priced: {', '.join(sorted(table))} (give a price)")
    return table[gpu].usd_per_gpu_hour


def price_note(gpu: str) -> str:
    """Where a default price comes from, for captions: '$2.69/GPU-h (RunPod ..., as of 2026-03-10)'."""
    p = price_table()[gpu]
    return f"${p.usd_per_gpu_hour:g}/GPU-h, {p.gpu} default as of {p.as_of}"


def input_start(gpu: str | None) -> tuple[float, str | None]:
    """Where a page's price input for ``gpu`` starts, and why when that is not the price table's own row: the table
    cannot be read or has no row for the GPU (None: a custom GPU). Then there is no default price; the input starts
    at the shipped table's row for the GPU (or for h100-sxm), cited, to be replaced by the user's own."""
    problem = table_problem()
    if problem is None and gpu in price_table():
        return price_table()[gpu].usd_per_gpu_hour, None
    shipped = _table(str(PRICES_FILE))
    start = gpu if gpu in shipped else "h100-sxm"
    p = shipped[start]
    why = problem if problem is not None else (
        f"{_where(table_path())} has no row for {gpu}" if gpu is not None else "a custom GPU is not in the price table")
    return p.usd_per_gpu_hour, (f"no default price ({why}); the input starts at the shipped table's {start} price, "
                                f"${p.usd_per_gpu_hour:g}/GPU-h as of {p.as_of}: enter your own")


def check_price(gpu_hour_usd: float, name: str = "gpu_hour_usd") -> float:
    v = gpu_hour_usd
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= MAX_GPU_HOUR_USD:
        raise ValueError(f"{name}={v!r} is out of range; allowed > 0 to {MAX_GPU_HOUR_USD:g}")
    return float(v)


@dataclass(frozen=True)
class Price:
    """A deployment's price: the nodes for the target and what they cost per million output tokens."""

    nodes: int | None  # whole nodes for the target x headroom (None: no rate meets the SLOs)
    usd_per_hour: float | None  # the fleet's: nodes x GPUs per node x $ per GPU-hour
    usd_per_million_output_tokens: float | None  # at the target traffic
    usd_per_million_output_tokens_at_capacity: float | None  # one copy at its highest rate within the SLOs
    mean_output_tokens: float
    headroom: float
    gpu_hour_usd: float
    target_rate_req_s: float

    def to_dict(self) -> dict:
        return asdict(self)


def copies_needed(target_rate_req_s: float, rate_per_copy_req_s: float, headroom: float) -> int | None:
    """Copies of a configuration that carry the target with the headroom: ⌈target x headroom / rate⌉."""
    if not rate_per_copy_req_s > 0:
        return None
    return max(1, math.ceil(target_rate_req_s * headroom / rate_per_copy_req_s - 1e-9))


def price(rate_per_copy_req_s: float, gpus_per_copy: int, gpus_per_node: int, target_rate_req_s: float,
          gpu_hour_usd: float, mean_output_tokens: float, headroom: float = DEFAULT_HEADROOM,
          nodes: int | None = None) -> Price:
    """The one pricing rule (module docstring). ``rate_per_copy_req_s``: the highest rate one copy (``gpus_per_copy``
    GPUs: a node's replicas, or a split) sustains within the SLOs; copies are counted in whole nodes of
    ``gpus_per_node`` GPUs. ``nodes`` overrides the count (a fleet check that added nodes)."""
    gpu_hour_usd = check_price(gpu_hour_usd)
    if not target_rate_req_s > 0:
        raise ValueError(f"target_rate_req_s={target_rate_req_s!r} is out of range; allowed > 0")
    if not mean_output_tokens > 0:
        raise ValueError(f"mean_output_tokens={mean_output_tokens!r} is out of range; allowed > 0")
    if nodes is None:
        copies = copies_needed(target_rate_req_s, rate_per_copy_req_s, headroom)
        nodes = None if copies is None else math.ceil(copies * gpus_per_copy / gpus_per_node - 1e-9)
    usd_h = None if nodes is None else nodes * gpus_per_node * gpu_hour_usd
    at_target = None if usd_h is None else usd_h / (target_rate_req_s * mean_output_tokens * 3600.0) * 1e6
    at_cap = None
    if rate_per_copy_req_s > 0:
        at_cap = gpus_per_copy * gpu_hour_usd / (rate_per_copy_req_s * mean_output_tokens * 3600.0) * 1e6
    return Price(nodes, usd_h, at_target, at_cap, float(mean_output_tokens), float(headroom), gpu_hour_usd,
                 float(target_rate_req_s))
