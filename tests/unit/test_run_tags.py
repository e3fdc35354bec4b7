"""Every host-wide name a test creates carries this run's tag (tests/helpers.py RUN_TAG), so two
runs on one machine never share, nor remove, each other's (issue 38). A network namespace named by
a plain string constant (tests/monitor/test_alerting.py had "hkalert-node", and its set-up deletes
that name first: a second run tore down the first one's node) fails here."""
import ast
import os

from tests.helpers import REPO

TESTS = os.path.join(REPO, "tests")


def netns_adds(tree):
    """(argument node, line) of every `..."ip", "netns", "add", NAME...` call."""
    for call in ast.walk(tree):
        if not isinstance(call, ast.Call):
            continue
        args = call.args[0].elts if len(call.args) == 1 and isinstance(call.args[0], (ast.List, ast.Tuple)) \
            else call.args
        lits = [a.value if isinstance(a, ast.Constant) else None for a in args]
        for i in range(len(lits) - 1):
            if lits[i] == "netns" and lits[i + 1] == "add" and i + 2 < len(args):
                yield args[i + 2], call.lineno


def constants(tree) -> dict:
    """Module-level NAME = "string" assignments."""
    out = {}
    for st in tree.body:
        if isinstance(st, ast.Assign) and isinstance(st.value, ast.Constant) and isinstance(st.value.value, str):
            for t in st.targets:
                if isinstance(t, ast.Name):
                    out[t.id] = st.value.value
    return out


def test_every_network_namespace_a_test_adds_carries_the_run_tag():
    bad, seen = [], 0
    for d, _, files in os.walk(TESTS):
        for f in files:
            if not f.endswith(".py"):
                continue
            path = os.path.join(d, f)
            tree = ast.parse(open(path).read(), path)
            consts = constants(tree)
            for arg, line in netns_adds(tree):
                seen += 1
                rel = f"{os.path.relpath(path, REPO)}:{line}"
                if isinstance(arg, ast.Constant):
                    bad.append(f"{rel}: the literal {arg.value!r}")
                elif isinstance(arg, ast.Name) and arg.id in consts:
                    bad.append(f"{rel}: {arg.id} = {consts[arg.id]!r}, a plain string")
    assert seen >= 10, seen   # the scan found the suites' namespaces
    assert bad == [], "untagged network namespaces (use tests.helpers.tagged): " + "; ".join(bad)
