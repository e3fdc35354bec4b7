#!/usr/bin/env bash
# Build a small Debian test node for the VM tests: systemd, dbus, sshd, python3, ethtool,
# iproute2, ping and Debian's cloud kernel (fq_codel built in). The toolkit is not in the image:
# the hkgpu_install role installs it from the wheelhouse built here (PyPI wheels for the
# guest's Python 3.11), as it would on a node with no package index.
# For the launch-form tests (test_triton_vm.py): Debian's podman, crun, netavark (its network
# stack, unused with --network host but a dependency), libpython3.11 (the
# Python backend's stub links it), and the nvidia-pytriton wheel (its CPU tritonserver) with what
# the toolkit's triton subsystem imports, installed into the node's Python (/usr/local), which the
# toolkit's venv sees (--system-site-packages). No registry: the container image is built inside
# the VM from its own root filesystem.
#   tests/vm/build.sh OUTDIR   -> OUTDIR/{disk.img,vmlinuz,initrd.img,id_ed25519,wheelhouse/}
set -euo pipefail
OUT=$(realpath -m "${1:?usage: build.sh OUTDIR}")
REPO=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
[ -s "$OUT/disk.img" ] && [ -s "$OUT/vmlinuz" ] && [ -d "$OUT/wheelhouse" ] && { echo "vm image exists in $OUT"; exit 0; }
ROOT="$OUT/rootfs"
rm -rf "$ROOT"

# the mirror this host already uses
MIRROR=$(sed -n 's/^URIs: *\([^ ]*debian\/*\)$/\1/p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -1)
[ -n "$MIRROR" ] || MIRROR=$(awk '/^deb /{print $2; exit}' /etc/apt/sources.list)

debootstrap --variant=minbase \
  --include=systemd-sysv,udev,dbus,openssh-server,python3,python3-venv,ethtool,iproute2,kmod,iputils-ping,iperf3,linux-image-cloud-amd64,initramfs-tools,podman,crun,netavark,libpython3.11,sudo,prometheus,prometheus-node-exporter,prometheus-alertmanager \
  bookworm "$ROOT" "$MIRROR" >"$OUT/debootstrap.log" 2>&1

# day one (tests/vm/test_dayone_vm.py): Debian's prometheus, node_exporter and alertmanager as
# Debian ships them, and an operator who logs in as `ops` and becomes root through sudo
chroot "$ROOT" useradd -m -s /bin/bash ops
echo "ops ALL=(ALL) NOPASSWD:ALL" >"$ROOT/etc/sudoers.d/ops"
chmod 440 "$ROOT/etc/sudoers.d/ops"

# the toolkit's runtime dependencies as wheels for the guest (the role copies them over)
rm -rf "$OUT/wheelhouse"
deps=$(python3 -c 'import tomllib, sys; print(" ".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]))' "$REPO/pyproject.toml")
python3 -m pip download -q --disable-pip-version-check --only-binary=:all: --python-version 3.11 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  -d "$OUT/wheelhouse" $deps

# the Triton server (CPU) and the triton subsystem's imports, for the guest's Python 3.11
SITE="$ROOT/usr/local/lib/python3.11/dist-packages"
plat="--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --platform manylinux2014_x86_64
  --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_35_x86_64"
python3 -m pip install -q --disable-pip-version-check $plat --target "$SITE" \
  'numpy<2' 'tritonclient[grpc]' protobuf prometheus-client aiohttp
python3 -m pip install -q --disable-pip-version-check $plat --no-deps --target "$SITE" nvidia-pytriton
rm -rf "$SITE/bin"

# system: hostname, fstab, network by MAC (tests/vm/vm.py sets them): the management NIC for
# SSH (QEMU user network), the data NIC (tap into the test's namespace), owned by networkd
echo hkvm >"$ROOT/etc/hostname"
# as Debian's installer writes it: sudo looks its host name up, and with no answer it waits for
# DNS (the guest has none) past Ansible's become timeout
printf '127.0.0.1\tlocalhost\n127.0.1.1\thkvm\n' >"$ROOT/etc/hosts"
echo "/dev/vda / ext4 rw,relatime 0 1" >"$ROOT/etc/fstab"
mkdir -p "$ROOT/etc/systemd/network"
printf '[Match]\nMACAddress=52:54:00:00:02:0f\n[Network]\nAddress=10.0.2.15/24\nGateway=10.0.2.2\nLinkLocalAddressing=no\n' \
  >"$ROOT/etc/systemd/network/10-mgmt.network"
printf '[Match]\nMACAddress=52:54:00:12:c9:01\n[Network]\nAddress=198.18.201.1/24\nLinkLocalAddressing=no\n' \
  >"$ROOT/etc/systemd/network/20-data.network"
chroot "$ROOT" systemctl enable systemd-networkd ssh >/dev/null 2>&1
rm -f "$ROOT"/etc/ssh/ssh_host_*
chroot "$ROOT" ssh-keygen -A >/dev/null
rm -f "$OUT/id_ed25519" "$OUT/id_ed25519.pub"
ssh-keygen -q -t ed25519 -N '' -f "$OUT/id_ed25519"
install -d -m 700 "$ROOT/root/.ssh"
install -m 600 "$OUT/id_ed25519.pub" "$ROOT/root/.ssh/authorized_keys"
install -d -m 700 "$ROOT/home/ops/.ssh"
install -m 600 "$OUT/id_ed25519.pub" "$ROOT/home/ops/.ssh/authorized_keys"
chroot "$ROOT" chown -R ops:ops /home/ops/.ssh

cp "$(ls "$ROOT"/boot/vmlinuz-* | head -1)" "$OUT/vmlinuz"
cp "$(ls "$ROOT"/boot/initrd.img-* | head -1)" "$OUT/initrd.img"
rm -f "$OUT/disk.img"
mkfs.ext4 -q -F -L root -d "$ROOT" "$OUT/disk.img" 5G
rm -rf "$ROOT"
echo "vm image built in $OUT"
