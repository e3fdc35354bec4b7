"""A site repository for pull mode on the simulated rack (tests/rack/test_pull.py, bench/fleet_converge.py).

make(run, inventory, canaries): a bare git repository RUN/site.git and its work tree RUN/site with
this tree's playbooks, roles and collection, the rack's inventory and group_vars, and pull vars.
pull(host): what hkgpu-tune-pull.service runs, its ExecStart in the host's namespace with a clean
environment (systemd is not PID 1 here).
"""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import yaml

import simrack
from simrack import REPO

SITE_FILES = ("ansible.cfg", "playbooks", "roles", "collections")
SKIP_TAGS = ("node_exporter",)


def git(cwd, *argv):
    return subprocess.run(["git", "-C", cwd, "-c", "user.name=ops", "-c", "user.email=ops@example.net", *argv],
                          capture_output=True, text=True, check=True).stdout.strip()


def make(run: str, inventory: str, canaries=("hkrack-n1",)) -> dict:
    work, bare = os.path.join(run, "site"), os.path.join(run, "site.git")
    files = subprocess.run(["git", "-C", REPO, "ls-files", *SITE_FILES], capture_output=True, text=True,
                           check=True).stdout.split("\n")
    for f in files:
        if f and os.path.lexists(os.path.join(REPO, f)):
            os.makedirs(os.path.dirname(os.path.join(work, f)), exist_ok=True)
            shutil.copy2(os.path.join(REPO, f), os.path.join(work, f), follow_symlinks=False)
    inv = os.path.join(work, "inventory", "site")
    os.makedirs(os.path.join(inv, "host_vars"))
    shutil.copy(inventory, os.path.join(inv, "hosts.yml"))
    shutil.copytree(os.path.join(os.path.dirname(inventory), "group_vars"), os.path.join(inv, "group_vars"))
    rack = os.path.join(inv, "group_vars", "rack_sim1.yml")
    doc = yaml.safe_load(open(rack))
    doc["hkgpu_network_fabric_peers"] = [simrack.GATEWAY, simrack.FABRIC_PEER]   # this rack's subnet
    with open(rack, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    with open(os.path.join(inv, "group_vars", "all.yml"), "w") as f:
        # node_exporter: no systemd runs here and /etc/default is this machine's, not the host's
        yaml.safe_dump({"hkgpu_pull_repo": "file://" + bare, "hkgpu_pull_inventory": "inventory/site/hosts.yml",
                        "hkgpu_pull_command": shutil.which("ansible-pull"),
                        "hkgpu_pull_skip_tags": list(SKIP_TAGS)}, f)
    for c in canaries:
        with open(os.path.join(inv, "host_vars", f"{c}.yml"), "w") as f:
            yaml.safe_dump({"hkgpu_pull_canary": True}, f)
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", bare], check=True)
    subprocess.run(["git", "init", "-q", "-b", "main", work], check=True)
    git(work, "add", "-A")
    git(work, "commit", "-qm", "v1")
    git(work, "push", "-q", bare, "main")
    return {"run": run, "work": work, "bare": bare, "inventory": os.path.join(inv, "hosts.yml")}


def publish(site: dict, fin_timeout=None, mtu=None, message="change") -> str:
    """The operator commits a new profile version to the site repository (no push to any node)."""
    path = os.path.join(site["work"], "inventory", "site", "group_vars", "rack_sim1.yml")
    doc = yaml.safe_load(open(path))
    if fin_timeout:
        doc["hkgpu_network_sysctl"]["net.ipv4.tcp_fin_timeout"] = fin_timeout
    if mtu:
        doc["hkgpu_network_interfaces"][0]["mtu"] = mtu
    yaml.safe_dump(doc, open(path, "w"), sort_keys=False)
    git(site["work"], "commit", "-qam", message)
    git(site["work"], "push", "-q", site["bare"], "main")
    return git(site["work"], "rev-parse", "HEAD")


def push_converge(site: dict, extra=()) -> subprocess.CompletedProcess:
    """The one push that installs the pull units (and the toolkit) from the site repository."""
    env = {**os.environ, "ANSIBLE_CONFIG": os.path.join(site["work"], "ansible.cfg")}
    return subprocess.run(["ansible-playbook", "-i", site["inventory"], "--skip-tags", ",".join(SKIP_TAGS), *extra,
                           os.path.join(site["work"], "playbooks", "site.yml")],
                          capture_output=True, text=True, env=env, timeout=3000)


def unit(host: str, name: str) -> str:
    return open(f"/etc/netns/{host}/systemd/system/{name}").read()


def exec_start(host: str) -> list[str]:
    return shlex.split(re.search(r"^ExecStart=(.*)$", unit(host, "hkgpu-tune-pull.service"), re.M)[1])


def pull(host: str) -> subprocess.CompletedProcess:
    env = {k: os.environ[k] for k in ("PATH", "HOME", "XDG_CACHE_HOME", "PYTHONPATH") if k in os.environ}
    return subprocess.run(["ip", "netns", "exec", host, *exec_start(host)], capture_output=True, text=True,
                          env=env, timeout=900)
