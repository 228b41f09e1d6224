"""The commands of a prefill/decode split (``Scenario.disagg``): every instance on its own GPUs
(``CUDA_VISIBLE_DEVICES``), HTTP port and KV-transfer ports, in the background, then the proxy or router in front.

Placement (``placement``): each instance on the lowest free GPU ids of the first node with room, no instance
spanning two nodes; a split that cannot be placed so gets a comment saying why instead of commands.

- vLLM 0.11: each ``vllm serve`` gets ``--port`` (prefill 8100 + i, decode 8200 + j) and
  ``VLLM_NIXL_SIDE_CHANNEL_PORT`` = 5600 + its first GPU id: the NIXL connector listens on that port + its TP rank
  (vllm/distributed/kv_transfer/kv_connector/v1/nixl_connector.py, NixlConnectorScheduler/Worker), so the ports of
  instances on disjoint GPUs never meet. Across nodes, ``VLLM_NIXL_SIDE_CHANNEL_HOST`` is the node's address. The
  proxy is vLLM's ``toy_proxy_server.py`` (tests/v1/kv_connector/nixl_integration/, docs
  features/nixl_connector_usage.md), run from a checkout of vLLM v0.11.0.
- SGLang 0.5.3: each server gets ``--port`` (30000 + n), ``--disaggregation-mode``, the NIXL transfer backend and,
  for a prefill server, its own ``--disaggregation-bootstrap-port`` (8998 + i); ``sglang_router.launch_router
  --pd-disaggregation`` lists each prefill URL with its bootstrap port and each decode URL, on port 8000.
"""
from __future__ import annotations

from batching.sim.simulate import Scenario
from batching.studies.launch_flags import (SGLANG_ROUTER_VERSION, SGLANG_VERSION, VLLM_VERSION, command, model_id,
                                           q, sglang_flags, vllm_flags)

VLLM_PREFILL_PORT, VLLM_DECODE_PORT, VLLM_NIXL_PORT, PROXY_PORT = 8100, 8200, 5600, 8000
SGLANG_PORT, SGLANG_BOOTSTRAP_PORT = 30000, 8998
VLLM_PROXY = "tests/v1/kv_connector/nixl_integration/toy_proxy_server.py"
KV_CONFIG = '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'


def placement(sc: Scenario) -> list[dict] | None:
    """``[{role, n (1-based within its role), tp, node (0-based), gpus}]`` in role order (prefills first), or None
    when some instance would have to span two nodes. Instances go in role order onto the lowest free GPU ids of the
    first node with room; when that leaves one without room, largest TP first (which packs TPs that divide the node)."""
    d = sc.disagg
    insts = [{"role": "prefill", "n": i + 1, "tp": d.prefill_tp} for i in range(d.prefill_instances)]
    insts += [{"role": "decode", "n": i + 1, "tp": d.decode_tp} for i in range(d.decode_instances)]
    for order in (insts, sorted(insts, key=lambda r: -r["tp"])):
        if _place(order, sc.deployment.node.num_gpus, max(sc.nodes, 1)):
            return insts
    return None


def _place(order: list[dict], per_node: int, nodes: int) -> bool:
    free = [list(range(per_node)) for _ in range(nodes)]
    for inst in order:
        node = next((k for k, f in enumerate(free) if len(f) >= inst["tp"]), None)
        if node is None:
            return False
        inst["node"], inst["gpus"] = node, free[node][:inst["tp"]]
        free[node] = free[node][inst["tp"]:]
    return True


def _host(node: int, nodes: int, local: str) -> str:
    return local if nodes == 1 else f"NODE{node + 1}_IP"


def _where(inst: dict, nodes: int) -> str:
    gpus = ",".join(map(str, inst["gpus"]))
    on = f" on node {inst['node'] + 1} (NODE{inst['node'] + 1}_IP)" if nodes > 1 else ""
    return f"{inst['role']} {inst['n']}: TP {inst['tp']} on GPUs {gpus}{on}"


def _unplaced(sc: Scenario, engine: str) -> str:
    d = sc.disagg
    return (f"# {engine}: the split ({d.describe()}) cannot be placed on {sc.nodes} node(s) of "
            f"{sc.deployment.node.num_gpus} GPUs without an instance spanning two nodes; no command is written")


def vllm_split(sc: Scenario) -> str:
    insts = placement(sc)
    if insts is None:
        return _unplaced(sc, f"vLLM {VLLM_VERSION}")
    nodes = max(i["node"] for i in insts) + 1
    dep = sc.deployment
    out = [f"# vLLM {VLLM_VERSION}: {dep.model.name} on {nodes} node{'s' if nodes > 1 else ''} of "
           f"{dep.node.num_gpus}x {dep.node.gpu.name}, {sc.disagg.describe()}, KV over NIXL. Each instance runs in "
           "the background (&) on its own GPUs, HTTP port and NIXL side-channel ports (VLLM_NIXL_SIDE_CHANNEL_PORT "
           "+ TP rank); the proxy in front sends each request to a prefill instance, then to a decode instance"]
    ports = {"prefill": [], "decode": []}
    hosts = {"prefill": [], "decode": []}
    noted = set()
    for inst in insts:
        role = inst["role"]
        flags, notes = vllm_flags(sc, inst["tp"], 1)
        port = (VLLM_PREFILL_PORT if role == "prefill" else VLLM_DECODE_PORT) + inst["n"] - 1
        ports[role].append(port)
        hosts[role].append(_host(inst["node"], nodes, "localhost"))
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, inst["gpus"])),
               "VLLM_NIXL_SIDE_CHANNEL_PORT": VLLM_NIXL_PORT + inst["gpus"][0]}
        if nodes > 1:
            env["VLLM_NIXL_SIDE_CHANNEL_HOST"] = f"NODE{inst['node'] + 1}_IP"
        comments = [] if role in noted else notes
        noted.add(role)
        out.append(command(["vllm", "serve", q(model_id(dep.model))],
                           [f"--port {port}"] + flags + [f"--kv-transfer-config {q(KV_CONFIG)}"],
                           comments + [_where(inst, nodes)], env, background=True))
    on = " on node 1" if nodes > 1 else ""
    out.append(command(["python", VLLM_PROXY],
                       [f"--port {PROXY_PORT}", "--prefiller-hosts " + " ".join(hosts["prefill"]),
                        "--prefiller-ports " + " ".join(map(str, ports["prefill"])),
                        "--decoder-hosts " + " ".join(hosts["decode"]),
                        "--decoder-ports " + " ".join(map(str, ports["decode"]))],
                       [f"the proxy{on}, clients send to port {PROXY_PORT}: vLLM's toy_proxy_server.py, run from a "
                        f"checkout of vLLM v{VLLM_VERSION}.0 (it is in the repository's tests, not in the wheel); it "
                        "takes prefill and decode instances in turn where the simulation picks the least loaded"]))
    return "\n".join(out)


def sglang_split(sc: Scenario) -> str:
    insts = placement(sc)
    if insts is None:
        return _unplaced(sc, f"SGLang {SGLANG_VERSION}")
    nodes = max(i["node"] for i in insts) + 1
    dep = sc.deployment
    out = [f"# SGLang {SGLANG_VERSION}: {dep.model.name} on {nodes} node{'s' if nodes > 1 else ''} of "
           f"{dep.node.num_gpus}x {dep.node.gpu.name}, {sc.disagg.describe()}, KV over NIXL. Each server runs in "
           "the background (&) on its own GPUs and port, each prefill server with its own bootstrap port; "
           f"sglang_router {SGLANG_ROUTER_VERSION} in PD mode sends each request to a prefill and a decode server"]
    router: list[str] = []
    noted = set()
    for k, inst in enumerate(insts):
        role = inst["role"]
        flags, notes = sglang_flags(sc, inst["tp"], 1, role)
        port = SGLANG_PORT + k
        flags = [f"--port {port}"] + (["--host 0.0.0.0"] if nodes > 1 else []) + flags
        flags += [f"--disaggregation-mode {role}", "--disaggregation-transfer-backend nixl"]
        url = f"http://{_host(inst['node'], nodes, '127.0.0.1')}:{port}"
        if role == "prefill":
            boot = SGLANG_BOOTSTRAP_PORT + inst["n"] - 1
            flags.append(f"--disaggregation-bootstrap-port {boot}")
            router.append(f"--prefill {url} {boot}")
        else:
            router.append(f"--decode {url}")
        comments = [] if role in noted else notes
        noted.add(role)
        out.append(command(["python", "-m", "sglang.launch_server", "--model-path", q(model_id(dep.model))], flags,
                           comments + [_where(inst, nodes)], {"CUDA_VISIBLE_DEVICES": ",".join(map(str, inst["gpus"]))},
                           background=True))
    on = " on node 1" if nodes > 1 else ""
    out.append(command(["python", "-m", "sglang_router.launch_router"],
                       ["--pd-disaggregation"] + router + ["--host 0.0.0.0", f"--port {PROXY_PORT}"],
                       [f"the router{on}, clients send to port {PROXY_PORT} (its policy is its own: the simulation "
                        "sends a prompt to the prefill server with the fewest outstanding requests)"]))
    return "\n".join(out)
