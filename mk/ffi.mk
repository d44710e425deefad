# kvroute-ffi: the C library (include/kvroute.h), its C tests and the Go package.
#
#   make test-c                 C tests with ASan/UBSan, the scenario diff against the core,
#                               valgrind on the smoke test, an install + pkg-config check, and
#                               ffi/README.md's install and C commands run as written
#   make test-go                the Go package's tests (installs Debian's golang-go if absent),
#                               and ffi/README.md's Go commands run as written
#   make install PREFIX=/usr/local
#                               libkvroute.a, libkvroute.so(.VERSION), kvroute.h, kvroute.pc
#   make bench-ffi              route cost: Rust API vs C ABI (criterion) and Go via cgo

TEST_TARGETS += test-c test-go
.PHONY: ffi-lib test-c test-go install bench-ffi

PREFIX ?= /usr/local
FFI_PROFILE ?= release
FFI_TARGET_DIR := $(or $(CARGO_TARGET_DIR),$(ROOT)/target)
FFI_DEBUG_DIR := $(FFI_TARGET_DIR)/debug
FFI_BUILD := $(ROOT)/tests/c/build
FFI_CC ?= gcc
FFI_WARN := -std=c11 -Wall -Wextra -Werror -g
FFI_CFLAGS := $(FFI_WARN) -I$(ROOT)/include
FFI_SAN := -fsanitize=address,undefined -fno-sanitize-recover=all
FFI_LIBS := -lpthread -ldl -lm
FFI_VERSION = $(shell sed -n 's/.*KVROUTE_VERSION "\(.*\)"/\1/p' $(ROOT)/include/kvroute.h)

ffi-lib:
	$(CARGO) build -p kvroute-ffi
	test -f $(FFI_DEBUG_DIR)/libkvroute.a && test -f $(FFI_DEBUG_DIR)/libkvroute.so

test-c: ffi-lib
	mkdir -p $(FFI_BUILD)
	$(ROOT)/tests/c/readme.sh check
	set -e; for t in test_api test_tokens smoke scenario readme_example; do \
	  $(FFI_CC) $(FFI_CFLAGS) $(FFI_SAN) $(ROOT)/tests/c/$$t.c $(FFI_DEBUG_DIR)/libkvroute.a $(FFI_LIBS) -o $(FFI_BUILD)/$$t; \
	done
	$(FFI_BUILD)/test_api $(ROOT)/tests/vectors/prefix_hash_v1.json
	$(FFI_BUILD)/test_tokens
	$(FFI_BUILD)/smoke
	$(FFI_BUILD)/readme_example | diff -u $(ROOT)/tests/c/readme_example.out -
	$(FFI_BUILD)/scenario $(ROOT)/tests/c/scenario.txt > $(FFI_BUILD)/scenario.c.out
	$(CARGO) run -q --example scenario -- $(ROOT)/tests/c/scenario.txt > $(FFI_BUILD)/scenario.rust.out
	diff -u $(FFI_BUILD)/scenario.rust.out $(FFI_BUILD)/scenario.c.out
	@echo "scenario: $$(grep -c '^route' $(FFI_BUILD)/scenario.c.out) routes through the C ABI equal the core's"
	command -v valgrind >/dev/null || (apt-get update && apt-get install -y valgrind)
	$(FFI_CC) $(FFI_CFLAGS) -O1 $(ROOT)/tests/c/smoke.c $(FFI_DEBUG_DIR)/libkvroute.a $(FFI_LIBS) -o $(FFI_BUILD)/smoke-valgrind
	valgrind -q --error-exitcode=1 --leak-check=full --show-leak-kinds=definite,indirect,possible \
	  --errors-for-leak-kinds=definite,indirect,possible $(FFI_BUILD)/smoke-valgrind
	@echo "valgrind: smoke test clean (no errors, no definite/indirect/possible leaks)"
	@echo "checking make install and kvroute.pc (debug build)"
	rm -rf $(FFI_BUILD)/prefix
	$(MAKE) --no-print-directory install PREFIX=$(FFI_BUILD)/prefix FFI_PROFILE=debug
	PKG_CONFIG_PATH=$(FFI_BUILD)/prefix/lib/pkgconfig pkg-config --exact-version=$(FFI_VERSION) kvroute
	$(FFI_CC) $(FFI_WARN) $(ROOT)/tests/c/smoke.c \
	  $$(PKG_CONFIG_PATH=$(FFI_BUILD)/prefix/lib/pkgconfig pkg-config --cflags --libs kvroute) \
	  -Wl,-rpath,$(FFI_BUILD)/prefix/lib -lpthread -o $(FFI_BUILD)/smoke-shared
	readelf -d $(FFI_BUILD)/smoke-shared | grep -q 'NEEDED.*\[libkvroute.so.$(FFI_VERSION)\]'
	$(FFI_BUILD)/smoke-shared
	$(FFI_CC) $(FFI_WARN) $(ROOT)/tests/c/smoke.c \
	  $$(PKG_CONFIG_PATH=$(FFI_BUILD)/prefix/lib/pkgconfig pkg-config --static --cflags --libs kvroute | sed 's/-lkvroute/-l:libkvroute.a/') \
	  -o $(FFI_BUILD)/smoke-static
	$(FFI_BUILD)/smoke-static
	@echo "ffi/README.md: the install and the C program, as written (tests/c/readme.sh)"
	$(ROOT)/tests/c/readme.sh c

install:
	$(CARGO) build -p kvroute-ffi $(if $(filter release,$(FFI_PROFILE)),--release,)
	install -d $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 644 $(FFI_TARGET_DIR)/$(FFI_PROFILE)/libkvroute.a $(DESTDIR)$(PREFIX)/lib/libkvroute.a
	install -m 755 $(FFI_TARGET_DIR)/$(FFI_PROFILE)/libkvroute.so $(DESTDIR)$(PREFIX)/lib/libkvroute.so.$(FFI_VERSION)
	ln -sf libkvroute.so.$(FFI_VERSION) $(DESTDIR)$(PREFIX)/lib/libkvroute.so
	install -m 644 $(ROOT)/include/kvroute.h $(DESTDIR)$(PREFIX)/include/kvroute.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(FFI_VERSION)|' $(ROOT)/ffi/kvroute.pc.in \
	  > $(DESTDIR)$(PREFIX)/lib/pkgconfig/kvroute.pc
	@echo "installed kvroute $(FFI_VERSION) ($(FFI_PROFILE)) under $(DESTDIR)$(PREFIX)"

# The Go tests link the shared library installed into a scratch prefix (the SONAME is the
# exact version, so the versioned file name must exist, as after `make install`), found as
# ffi/README.md tells a user: pkg-config through PKG_CONFIG_PATH, the prefix's lib directory as
# the run path (which also keys Go's build cache on the prefix: it ignores pkg-config's output).
FFI_GO_PREFIX := $(FFI_BUILD)/go-prefix
FFI_GO_ENV := PKG_CONFIG_PATH=$(FFI_GO_PREFIX)/lib/pkgconfig CGO_LDFLAGS="-Wl,-rpath,$(FFI_GO_PREFIX)/lib"

test-go: ffi-lib
	command -v go || (apt-get update && apt-get install -y golang-go)
	$(ROOT)/tests/c/readme.sh check
	cmp $(ROOT)/include/kvroute.h $(ROOT)/ffi/go/kvroute.h || \
	  { echo "ffi/go/kvroute.h differs from include/kvroute.h: KVROUTE_BLESS=1 cargo test -p kvroute-ffi --test header"; exit 1; }
	$(MAKE) --no-print-directory install PREFIX=$(FFI_GO_PREFIX) FFI_PROFILE=debug
	cd $(ROOT)/ffi/go && test -z "$$(gofmt -l .)" && $(FFI_GO_ENV) go vet ./...
	cd $(ROOT)/ffi/go && $(FFI_GO_ENV) \
	  go test -count=1 -race -tags kvroute_debug -v ./... 2>&1 | tail -n 40; test $${PIPESTATUS[0]} = 0
	@echo "ffi/README.md: the Go program in a module of its own, as written (tests/c/readme.sh)"
	$(ROOT)/tests/c/readme.sh go

bench-ffi:
	$(CARGO) bench -p kvroute-ffi --bench route
	$(MAKE) --no-print-directory install PREFIX=$(FFI_BUILD)/bench-prefix FFI_PROFILE=release
	cd $(ROOT)/ffi/go && PKG_CONFIG_PATH=$(FFI_BUILD)/bench-prefix/lib/pkgconfig \
	  CGO_LDFLAGS="-Wl,-rpath,$(FFI_BUILD)/bench-prefix/lib" \
	  go test -run '^$$' -bench . -benchtime 20000x -count 3 ./...
