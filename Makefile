# nixlctl developer targets. The README's quick start does not need make.
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS     := -X main.version=$(VERSION)

.PHONY: all build test lint fuzz bench clean gpu-bundle gpu-check

all: build

build:
	go build -ldflags "$(LDFLAGS)" -o bin/nixlctl ./cmd/nixlctl

test:
	bash scripts/test.sh

lint:
	@out=$$(gofmt -l .); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	go run $(STATICCHECK) ./...

# A short run of every fuzz target (FUZZTIME per target).
FUZZTIME ?= 15s
fuzz:
	@for pkg in $$(go list ./...); do \
	  for f in $$(go test -list '^Fuzz' $$pkg | grep '^Fuzz'); do \
	    echo "== $$pkg $$f"; go test -run '^$$' -fuzz "^$$f$$" -fuzztime $(FUZZTIME) $$pkg || exit 1; \
	  done; \
	done

bench:
	go test -run '^$$' -bench . -benchmem ./...

# What a GPU machine without Go, UCX or libzmq needs, in .device/gpu (and
# .device/gpu.tar.xz to carry); then the GPU check (docs/gpu.md).
gpu-bundle:
	PACK=1 bash scripts/gpu-bundle.sh .device/gpu

gpu-check:
	bash scripts/gpu-check.sh results/gpu-check

clean:
	rm -rf bin
