# kiln — build, test, demo, benchmarks.
# Every target that needs system tools depends on `deps`, which installs them
# with apt-get when missing (CI machines start bare).

GO        ?= go
TAGS      := containers_image_openpgp,exclude_graphdriver_btrfs
GOFLAGS   := -tags=$(TAGS) -trimpath
export CGO_ENABLED := 0
BIN       := out/kiln
# The node's edition of kiln (serve + agent only), copied onto the image
# partition: no factory libraries, so a quarter of the size and a registry
# that starts without their package inits (docs/decisions.md).
AGENT_BIN := out/kiln-agent
# What `kiln --version` says, and what kiln records in kiln.json and bundle
# manifests: git describe and the commit. The same commit gives the same
# strings, so the same binaries.
VERSION_PKG := github.com/kiln-appliance/kiln/internal/version
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null)
COMMIT    ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS   := -X $(VERSION_PKG).version=$(VERSION) -X $(VERSION_PKG).commit=$(COMMIT)

# Debian packages the build and the tests need (qemu-system-x86: the e2e
# harness's own tests drive a stopped QEMU through its monitor; binutils,
# sbsigntool, efitools and systemd-boot-efi: Secure Boot keys and signed
# unified kernel images, systemd-boot-efi for systemd-stub and systemd-boot).
APT_PKGS := gdisk squashfs-tools e2fsprogs dosfstools mtools fdisk skopeo podman \
            ignition zstd xz-utils util-linux openssl cryptsetup-bin systemd qemu-system-x86 \
            binutils sbsigntool efitools systemd-boot-efi
# gcc + libc6-dev: the e2e fixture builds CRI-O's pinns helper (static C).
APT_E2E  := ovmf debootstrap gcc libc6-dev make
# The reference registry the benchmarks measure kiln serve against.
APT_BENCH := docker-registry
# Graphviz renders the docs' pictures (make pictures).
APT_PICTURES := graphviz

.PHONY: all build install test demo demo-upgrade bench e2e fuzz deps deps-e2e deps-bench deps-pictures pictures clean vet

all: build

build:
	@mkdir -p out
	$(GO) build $(GOFLAGS) -ldflags='$(LDFLAGS)' -o $(BIN) ./cmd/kiln
	$(GO) build -tags=$(TAGS),nodeonly -trimpath -ldflags='-s -w $(LDFLAGS)' -o $(AGENT_BIN) ./cmd/kiln

# kiln and kiln-agent side by side in $(DESTDIR)$(PREFIX)/bin: kiln takes
# the agent beside it. Not built here, so that `make build` runs as the user
# with Go on the PATH and `sudo make install` needs no Go.
PREFIX  ?= /usr/local
DESTDIR ?=
install:
	@test -x $(BIN) && test -x $(AGENT_BIN) || { echo "$(BIN) and $(AGENT_BIN) are missing: run make build first" >&2; exit 1; }
	install -d $(DESTDIR)$(PREFIX)/bin
	install -m 0755 $(BIN) $(AGENT_BIN) $(DESTDIR)$(PREFIX)/bin/

deps:
	@./test/deps.sh $(APT_PKGS)

deps-e2e:
	@./test/deps.sh $(APT_PKGS) $(APT_E2E)

deps-bench:
	@./test/deps.sh $(APT_PKGS) $(APT_BENCH)

deps-pictures:
	@./test/deps.sh $(APT_PICTURES)

# The node edition's files (tag nodeonly) are vetted too: nothing else builds them with their tests.
vet:
	$(GO) vet $(GOFLAGS) ./...
	$(GO) vet -tags=$(TAGS),nodeonly -trimpath ./cmd/kiln

# CRI-O's own config code checks kiln's node files (test/crio: a module of
# its own, CRI-O's dependency tree cannot share kiln's go.mod).
CRIO_TAGS := $(TAGS),exclude_graphdriver_devicemapper

# The test command (README): unit and integration tests, real tools, no QEMU.
test: deps build vet
	$(GO) test $(GOFLAGS) -count=1 -timeout 30m ./...
	cd test/crio && $(GO) vet -tags=$(CRIO_TAGS) ./... && $(GO) test -tags=$(CRIO_TAGS) -trimpath -count=1 -timeout 10m ./...

# The demo's signing key (kiln key generate never overwrites one).
DEMO_KEY := out/demo/factory

demo: deps build
	$(GO) run $(GOFLAGS) ./test/demo out/demo
	@test -f $(DEMO_KEY).key || $(BIN) key generate $(DEMO_KEY)
	$(BIN) lock recipes/demo.yaml
	$(BIN) build recipes/demo.yaml -o out/demo.raw
	$(BIN) inspect out/demo.raw

# The upgrade path: release 1.1 of the demo as a signed delta stick for the
# 1.0 disk that make demo built, checked and inspected.
demo-upgrade: demo
	$(BIN) lock recipes/demo-1.1.yaml
	$(BIN) bundle recipes/demo-1.1.yaml --key $(DEMO_KEY).key --from out/demo.raw -o out/demo-1.1.img
	$(BIN) verify out/demo-1.1.img --key $(DEMO_KEY).pub
	$(BIN) inspect out/demo-1.1.img

# The docs' pictures: each docs/pictures/NAME.dot rendered to NAME.svg beside
# it. The SVGs are checked in, so the docs show them without Graphviz.
PICTURES := $(patsubst %.dot,%.svg,$(wildcard docs/pictures/*.dot))
pictures: deps-pictures
	@for f in $(PICTURES); do echo "dot -Tsvg $${f%.svg}.dot -o $$f"; dot -Tsvg "$${f%.svg}.dot" -o "$$f" || exit 1; done

bench: deps-bench build
	$(GO) test $(GOFLAGS) -run '^$$' -bench . -benchtime 1x -timeout 60m ./...

# Each fuzz target runs a fixed number of inputs (about 10 s each here; the count
# after the second colon); corpora found failing land in testdata/fuzz. A count,
# not a duration: Go 1.26's coordinator can report its own -fuzztime deadline as
# a failure ("context deadline exceeded", go.dev/issue/75804, fixed in 1.27) on a
# loaded machine, and a count has no deadline to race. FUZZTIME=60s (or 1000000x)
# overrides every target's budget, for a longer run by hand.
FUZZTIME ?=
FUZZ_TARGETS := \
	./builder/preload/internal/layerscan:FuzzTar:100000 \
	./partitions/seal:FuzzDiskReaders:500 \
	./partitions/squashfs:FuzzRawSquashfs:30000 \
	./recipes:FuzzLoad:100000 \
	./systemd/contract/regindex:FuzzParseName:100000 \
	./systemd/agent/registry:FuzzRoute:100000 \
	./systemd/contract/regindex:FuzzValidDigest:100000 \
	./systemd/contract/regindex:FuzzRegistryIndex:300000 \
	./systemd/contract/bundlefmt:FuzzDecode:20000 \
	./systemd/contract/slot:FuzzDecode:200000
fuzz:
	@set -e; for t in $(FUZZ_TARGETS); do \
	  pkg=$${t%%:*}; rest=$${t#*:}; fn=$${rest%%:*}; budget=$${rest#*:}x; \
	  [ -z "$(FUZZTIME)" ] || budget=$(FUZZTIME); \
	  grep -qs "^func $$fn(" $$pkg/*_test.go || { echo "fuzz: $$pkg has no $$fn (go test would fuzz nothing and pass)"; exit 1; }; \
	  echo "fuzz $$pkg $$fn ($$budget)"; \
	  $(GO) test $(GOFLAGS) -run '^$$' -fuzz "^$$fn\$$" -fuzztime $$budget -timeout 10m $$pkg; \
	done

# The machines run two at a time: each QEMU guest (TCG, 2 vCPUs) is CPU-bound
# on the 2-core machine. Three side by side once beat one after the other
# (455 s against 1,250 s), but against two they oversubscribe the cores: the
# same scenario took 11 min 41 s as one of three (2026-11-28) and 5 min 10 s
# as one of two (docs/e2e.md). The test's own slots (vm.Schedule) start the
# longest scenarios first, so Go's -parallel only has to let them all ask.
# The timeout leaves CI's 90 min room for the phases before.
E2E_PARALLEL ?= 2
e2e: deps-e2e build
	$(GO) run $(GOFLAGS) ./test/e2e/fixture/prebuild
	KILN_E2E_MACHINES=$(E2E_PARALLEL) $(GO) test -tags=$(TAGS),e2e -trimpath -count=1 -timeout 83m -parallel 64 -v ./test/e2e/...

clean:
	rm -rf out
