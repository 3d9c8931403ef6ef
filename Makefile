# Tabby — see README.md. `make demo` and `make test` are the two entry points.
GO      ?= $(shell command -v go 2>/dev/null || echo /usr/local/go/bin/go)
BIN     := $(CURDIR)/bin
# Tests build binaries with `go` too: make sure they find the same one.
export PATH := $(dir $(GO)):$(PATH)
PKGS    := ./...
CMDS    := tabby-agent tabby tabbyctl tabby-lab tabby-kube-controllers tabby-relay
TESTFLAGS ?= -count=1 -timeout 20m -p 2
# Every binary prints this (tabbyctl version, tabby-agent --version); a build
# without make falls back to the VCS revision Go records (internal/version).
VERSION ?= $(shell git describe --always --dirty 2>/dev/null)
LDFLAGS := -s -w $(if $(VERSION),-X github.com/tabbynet/tabby/internal/version.stamped=$(VERSION))

.PHONY: all build test unit lint deps demo demo-k8s clean kube-bins images npapi-bins conformance-npapi e2e-autorr

all: build

build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN)/ $(addprefix ./cmd/,$(CMDS))

# The node image and the lab's pause image as OCI archives in bin/images,
# without a container engine (internal/cmd/mkimage; the Dockerfile builds the
# same node image with Docker): `ctr -n k8s.io images import` loads them.
# portmap comes from the containernetworking/plugins release go.mod names,
# installed as the Dockerfile does.
# The lab's Service backend image (internal/cmd/echo) too, and its CoreDNS
# image (bin/images/coredns.oci.tar) when `make kube-bins` has built CoreDNS.
IMAGE_TAG ?= dev
COREDNS_BIN ?= $(or $(COREDNS_CACHE),/var/cache/tabby/coredns)/v1.15.0/coredns
images: build
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(BIN)/ ./internal/cmd/pause ./internal/cmd/echo ./internal/cmd/mkimage
	CGO_ENABLED=0 GOBIN=$(BIN) $(GO) install -trimpath -ldflags "-s -w" \
		github.com/containernetworking/plugins/plugins/meta/portmap@$$($(GO) list -m -f '{{.Version}}' github.com/containernetworking/plugins)
	$(BIN)/mkimage -bin $(BIN) -tag $(IMAGE_TAG) -out $(BIN)/images $(if $(wildcard $(COREDNS_BIN)),-coredns $(COREDNS_BIN)) \
		$(if $(wildcard $(NPAPI_DIR)/agnhost),-agnhost $(NPAPI_DIR))

# Every tier: unit (with -race), then as root privileged and end-to-end;
# ends with which tiers ran and which were skipped, and why
# (scripts/test-tiers.sh). TIERS="unit" runs only some.
test: build images
	GO=$(GO) BIN=$(BIN) TESTFLAGS="$(TESTFLAGS)" ./scripts/test-tiers.sh

# Unit tier only (no root needed, no namespaces), with the same report.
unit:
	GO=$(GO) BIN=$(BIN) TESTFLAGS="$(TESTFLAGS)" TIERS=unit ./scripts/test-tiers.sh

# kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and kubectl
# for the Kubernetes test tier and the lab, built once from the module proxy
# (scripts/kube-build) into /var/cache/tabby/kube/<version>; only the missing
# ones are built, a no-op when all are there. `make test` does not build them
# (see README).
# kube-proxy of the same release runs on every lab node; CoreDNS, the lab's
# cluster DNS, is built the same way (scripts/coredns-build, cached in
# /var/cache/tabby/coredns/<version>).
kube-bins:
	GO=$(GO) ./scripts/kube-bins.sh
	GO=$(GO) ./scripts/coredns-bins.sh

# The network-policy-api conformance suite (scripts/npapi-conformance) and
# its pod image's agnhost, built from the module proxy into
# /var/cache/tabby/npapi (scripts/npapi-bins.sh); `make images` then adds
# bin/images/agnhost.oci.tar. `make conformance-npapi` runs the whole suite
# against a Kubernetes lab (e2e TestNPAPIConformance with NPAPI_FULL=1);
# `make test` runs its short subset when all this is built.
NPAPI_DIR ?= $(or $(NPAPI_CACHE),/var/cache/tabby/npapi)/$(shell awk '$$1=="sigs.k8s.io/network-policy-api"{print $$2}' scripts/npapi-conformance/go.mod)-k8s$(shell sed -n 's/^require k8s.io\/kubernetes \(v[0-9.]*\)$$/\1/p' scripts/kube-build/go.mod)
export NPAPI_DIR
npapi-bins:
	GO=$(GO) ./scripts/npapi-bins.sh

conformance-npapi: build kube-bins npapi-bins images
	NPAPI_FULL=1 NPAPI_DIR=$(NPAPI_DIR) TABBY_BIN=$(BIN) $(GO) test -count=1 -timeout 90m -p 1 -v -run '^TestNPAPIConformance$$' ./e2e/

# Automatic route reflectors at 30 nodes in two zones (e2e TestAutoReflectors;
# `make test` runs it with 8): convergence from no choice, a reflector's
# SIGKILL with continuous ping, joins and leaves, the record's writes.
AUTORR_NODES ?= 30
e2e-autorr: build
	TABBY_AUTORR_NODES=$(AUTORR_NODES) TABBY_BIN=$(BIN) $(GO) test -count=1 -timeout 30m -p 1 -v -run '^TestAutoReflectors$$' ./e2e/

lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	@$(GO) mod tidy -diff >/dev/null || { echo "go.mod/go.sum not tidy: run go mod tidy"; $(GO) mod tidy -diff; exit 1; }

deps:
	@./scripts/deps.sh

demo: deps build
	$(BIN)/tabby-lab demo $(DEMOFLAGS)

# The same on Kubernetes: a control plane and a kubelet per lab node, Tabby
# deployed from manifests/ with kubectl, a Deployment's pods pinging each
# other. Builds the Kubernetes binaries first when they are not cached (long
# the first time: see docs/kubernetes-lab.md).
demo-k8s: deps build kube-bins images
	$(BIN)/tabby-lab demo --kubernetes --bin-dir $(BIN) --manifests $(CURDIR)/manifests $(DEMOFLAGS)

clean:
	rm -rf $(BIN)

# The scale harness's sweep (docs/scale.md, BENCHMARKS.md "Scale harness"):
# real reflectors and agents plus N simulated nodes, N = SCALE_SIZES, then
# the largest N again with the agents and simulated nodes behind etcd's
# gRPC proxy, then every N with the agents' views through the watch relay
# (120 s rests and 2,400 churn events: per-event figures over the runtime's
# forced-collection period). Results (table, JSON, plot) in SCALE_OUT. Long:
# not in `make test` (TestSimHarness is its short representative run).
SCALE_SIZES ?= 10,100,300,1000
SCALE_OUT   ?= $(CURDIR)/docs/scale
comma := ,
.PHONY: scale-sweep
scale-sweep: build
	$(BIN)/tabby-lab sim --name scale --bin-dir $(BIN) --sizes $(SCALE_SIZES) --out $(SCALE_OUT) $(SCALEFLAGS)
	$(BIN)/tabby-lab sim --name scalepx --bin-dir $(BIN) --etcd-proxy --sizes $(lastword $(subst $(comma), ,$(SCALE_SIZES))) --out $(SCALE_OUT)/etcd-proxy $(SCALEFLAGS)
	$(BIN)/tabby-lab sim --name scalerl --bin-dir $(BIN) --relay --idle-window 120s --churn-events 2400 --sizes $(SCALE_SIZES) --out $(SCALE_OUT)/relay $(SCALEFLAGS)
