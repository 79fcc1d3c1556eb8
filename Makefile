# ztier: `make test` runs every test (installing the Debian packages the
# tests need when run as root); `cargo run --release -- demo` runs the demo.

CARGO ?= cargo
FUZZ_SECONDS ?= 20

.PHONY: test deps lint unit miri fuzz-ci bench soak conformance install-docs

test: deps lint unit miri fuzz-ci
	@echo "make test: all steps passed"

deps:
	./scripts/install-deps.sh

# Formatting, clippy, the docs (every intra-doc link resolves; every
# relative link and anchor of the Markdown files resolves, and
# ARCHITECTURE.md stays a map of at most 400 lines), and the
# C measurement scripts the write-ups in docs/measurements cite (they
# must keep compiling;
# one that includes lz4.h is built with the liblz4 sources lz4-sys
# brought, see scripts/lz4-src.sh).
# The codec crate's opt-in features are linted too: `safe` (its tests run
# in `unit`) and `avx512`, whose kernel no CI machine can run but which
# must keep compiling cleanly (docs/codec.md says how to test it).
# Right after formatting (it takes a second): no import cycle among the
# modules of a crate, nor among those inside a folder module such as
# crates/ztier/src/cmd; each cycle found is printed with a file:line per
# edge (scripts/modcycles.py).
# (The docs with --release: they reuse clippy's checked dependencies and
# build scripts, the library `ztier` embeds among them; 1m12s against
# 1m43s after clippy here.)
lint:
	$(CARGO) fmt --all -- --check
	python3 scripts/modcycles.py --self-test
	python3 scripts/modcycles.py
	$(CARGO) clippy --workspace --all-targets --release -- -D warnings
	$(CARGO) clippy -p ztier-codec --all-targets --release --features safe -- -D warnings
	$(CARGO) clippy -p ztier-codec --all-targets --release --features avx512 -- -D warnings
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --release --workspace --no-deps --document-private-items
	for c in scripts/*.c; do cc -O2 -Wall -Wextra -Werror -pthread -o /dev/null $$c $$(scripts/lz4-src.sh $$c) || exit 1; done
	python3 scripts/check-docs.py

# The second line runs the codec tests again on the WK codecs built from
# their safe twins alone (the codec crate's `safe` feature).
# The `ztier run` tests of cli_run run three times more: with faults
# served in the faulting thread (--fault-path signal), and with the
# user-mode-only userfaultfd an unprivileged user gets (forced here, as
# root) on both paths: there the default (auto) serves them in the
# faulting thread, so the handler thread is asked for too. Those of
# cli_run_modes run every way themselves, once. (--workspace: the same
# build as the first line's, nothing compiled again.)
unit:
	$(CARGO) test --workspace --release
	$(CARGO) test --release -p ztier-codec --features safe
	ZTIER_FAULT_PATH=signal $(CARGO) test --workspace --release --test cli_run
	ZTIER_UFFD_USER_MODE_ONLY=1 $(CARGO) test --workspace --release --test cli_run
	ZTIER_UFFD_USER_MODE_ONLY=1 ZTIER_FAULT_PATH=thread $(CARGO) test --workspace --release --test cli_run

# miri (a nightly toolchain's; scripts/install-deps.sh installs it) over
# the WK codecs' tests and the store's lock: undefined behaviour in their
# unsafe code fails. Built with AVX2 on, so that the WKdm AVX2 kernel,
# whose intrinsics miri emulates, runs there too (miri detects no CPU
# features). The tests too slow for miri are ignored under it; the rest
# take about a minute and a half, the build a few.
MIRI ?= cargo +nightly miri
MIRI_RUSTFLAGS ?= -C target-feature=+avx2,+popcnt
miri:
	RUSTFLAGS="$(MIRI_RUSTFLAGS)" $(MIRI) test -p ztier-codec --lib -- wkdm:: wk4x4:: wk64::
	RUSTFLAGS="$(MIRI_RUSTFLAGS)" $(MIRI) test -p ztier-store --lib -- lock

# Every fuzz target for a short time (FUZZ_SECONDS each), from its seeds.
fuzz-ci:
	./scripts/fuzz-ci.sh $(FUZZ_SECONDS)

bench:
	$(CARGO) run --release -- bench codecs --each --corpus ../shared/corpus/*.pages
	$(CARGO) run --release -- bench store --each --allocator all --scale 16 --corpus ../shared/corpus/*.pages
	$(CARGO) run --release -- bench blk
	$(CARGO) run --release -- bench pressure --budgets 256M --plot pressure.svg -- python3 examples/workloads/pyapp.py

# The `ztier run` tests ROUNDS times over (scripts/soak.sh): for races that
# one run of `make test` may miss. Not part of `make test`.
ROUNDS ?= 3
soak:
	./scripts/soak.sh $(ROUNDS)

# CPython's regression modules natively and under `ztier run`, compared
# module by module (crates/ztier/tests/cpython_conformance.rs; part of
# `make test` through the workspace's tests): this runs it alone and
# prints the table.
conformance: deps
	$(CARGO) test --release -p ztier --test cpython_conformance -- --nocapture

# The manual pages and shell completions, generated from the clap
# definitions (`ztier man`, `ztier completions`), installed under PREFIX.
PREFIX ?= /usr/local
install-docs:
	$(CARGO) build --release -p ztier
	target/release/ztier man $(DESTDIR)$(PREFIX)/share/man/man1
	mkdir -p $(DESTDIR)$(PREFIX)/share/bash-completion/completions $(DESTDIR)$(PREFIX)/share/zsh/site-functions $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d
	target/release/ztier completions bash > $(DESTDIR)$(PREFIX)/share/bash-completion/completions/ztier
	target/release/ztier completions zsh > $(DESTDIR)$(PREFIX)/share/zsh/site-functions/_ztier
	target/release/ztier completions fish > $(DESTDIR)$(PREFIX)/share/fish/vendor_completions.d/ztier.fish
