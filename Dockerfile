# Tabby's node image: tabby-agent (the DaemonSet), tabby (the CNI shim that
# install-cni copies to the host), tabbyctl, and portmap for hostPort.
#
#   docker build -t tabby:dev .
#
# Stage 1 builds static binaries; stage 2 holds only them.

FROM golang:1.26 AS build
WORKDIR /src
# Static binaries: the shim runs on the host, whatever its libc, and the
# runtime image needs no Go runtime libraries.
ENV CGO_ENABLED=0
# Dependencies first, so that a source change does not download them again.
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# docker build --build-arg VERSION=$(git describe --always --dirty) stamps
# the binaries' version; without it they name the revision Go records (the
# .git directory is not copied, so usually "devel").
ARG VERSION=
RUN LDFLAGS="-s -w${VERSION:+ -X github.com/tabbynet/tabby/internal/version.stamped=${VERSION}}" && \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/tabby-agent ./cmd/tabby-agent && \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/tabby-kube-controllers ./cmd/tabby-kube-controllers && \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/tabby-relay ./cmd/tabby-relay && \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/tabby ./cmd/tabby && \
    go build -trimpath -ldflags "$LDFLAGS" -o /out/tabbyctl ./cmd/tabbyctl
# portmap, chained after tabby in the network configuration, from the same
# containernetworking/plugins release that go.mod names. install-cni copies
# it to a node only when the node lacks one.
ARG CNI_PLUGINS_VERSION=v1.10.0
RUN GOBIN=/out/cni-plugins go install -trimpath -ldflags "-s -w" \
    github.com/containernetworking/plugins/plugins/meta/portmap@${CNI_PLUGINS_VERSION}

# The runtime image is the binaries and nothing else, the same files that
# `make images` (internal/cmd/mkimage) assembles without Docker; a test
# checks the two agree. The agent programs its firewall through nf_tables
# over netlink, so it needs no iptables userland; without a shell, debug
# with `kubectl debug` or from the node (docs/kubernetes-lab.md).
FROM scratch
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# tabby sits next to tabby-agent: install-cni's default --source-binary.
COPY --from=build /out/tabby-agent /out/tabby /out/tabbyctl /out/tabby-kube-controllers /out/tabby-relay /usr/local/bin/
# install-cni's default --plugins-dir.
COPY --from=build /out/cni-plugins/portmap /opt/tabby/cni-plugins/portmap
CMD ["tabby-agent"]
