#!/usr/bin/env bash
# Sourced by scripts/test.sh: the browser test (cmd/sandkeep/internal/viewer) drives Debian's chromium
# headless. When it is absent, install it with apt-get (root, or passwordless sudo), as CI
# does on a fresh machine. Without it the browser test skips, except under CI=true, where
# it fails.
if ! command -v chromium >/dev/null 2>&1 && ! command -v chromium-browser >/dev/null 2>&1; then
	sudo_cmd=()
	if [[ $(id -u) != 0 ]] && command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
		sudo_cmd=(sudo -n)
	fi
	if command -v apt-get >/dev/null 2>&1 && { [[ $(id -u) == 0 ]] || ((${#sudo_cmd[@]})); }; then
		echo "test: installing chromium (Debian package) for the browser test" >&2
		"${sudo_cmd[@]}" apt-get update -qq
		DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends chromium >/dev/null
	else
		echo "test: chromium is missing and cannot be installed here (apt-get as root); the browser test skips (fails under CI=true)" >&2
	fi
fi
