#!/usr/bin/env bash
# Makes ffi/README.md followable to the letter: its programs are the files the tests build, and
# its shell commands are the ones the tests run.
#
#   readme.sh check   every block marked <!-- file: PATH --> is PATH's content, byte for byte
#                     (PATH from the repository's root, and each file of SHOWN is shown); every
#                     sh block is marked <!-- run: NAME -->, so that a test runs it
#   readme.sh c       runs the "install" and "c" blocks as one shell session, with $HOME
#                     replaced by a new temporary directory, from the repository's root and with
#                     none of the variables the README sets; checks what the programs print; then
#                     compiles every unmarked c block (a fragment) inside handle() of
#                     tests/c/readme_example.c
#   readme.sh go      the same with the "install" and "go" blocks (a Go module of its own under
#                     the temporary directory, outside the repository); checks go.mod against
#                     the block marked <!-- shows: go.mod --> and what the program prints; builds
#                     it again from a copy of ffi/go outside the repository; and compiles every
#                     unmarked go block as a function of the program's package
#
# A marker is an HTML comment (invisible on GitHub) on the line right before a block's fence.
# `make install` runs with FFI_PROFILE=debug in the environment (the debug library the other
# tests use: a release build costs minutes); otherwise the commands run exactly as written.
# The temporary directory is removed on success and kept (and named) on failure.
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
README=$ROOT/ffi/README.md
EXPECTED=$ROOT/tests/c/readme_example.out
SHOWN=(tests/c/readme_example.c tests/c/readme_example.out ffi/go/example/main.go)

# blocks DIR: writes the README's fenced blocks to DIR/1, DIR/2, ... and one line per block to
# DIR/index: "N LANG MARKER", MARKER being "file:PATH", "run:NAME", "shows:NAME" or "-".
blocks() {
  awk -v dir="$1" '
    inblock && /^```[[:space:]]*$/ { inblock = 0; close(out); prev = ""; next }
    inblock { print > out; next }
    /^```/ {
      n++; inblock = 1; out = dir "/" n; printf "" > out
      lang = substr($0, 4); if (lang == "") lang = "-"
      m = "-"
      if (prev ~ /^<!-- (file|run|shows): [^ ]+ -->$/) {
        m = prev; sub(/^<!-- /, "", m); sub(/ -->$/, "", m); sub(/: /, ":", m)
      }
      print n, lang, m > (dir "/index")
      next
    }
    { prev = $0 }
    END { if (inblock) { print "ffi/README.md: unterminated code block " n > "/dev/stderr"; exit 1 } }
  ' "$README"
}

check() {
  local d fail=0 n lang m p
  d=$(mktemp -d)
  blocks "$d"
  while read -r n lang m; do
    case $m in
      file:*)
        p=${m#file:}
        if ! diff -u --label "$p" --label "ffi/README.md block $n" "$ROOT/$p" "$d/$n"; then
          echo "ffi/README.md: block $n differs from $p (copy the file into the README)" >&2
          fail=1
        fi
        ;;
    esac
    if [ "$lang" = sh ] && [[ $m != run:* ]]; then
      echo "ffi/README.md: sh block $n is run by no test: mark it <!-- run: NAME -->" >&2
      fail=1
    fi
  done < "$d/index"
  # The version the README names (file names, the SONAME) is the header's.
  local version
  version=$(sed -n 's/.*KVROUTE_VERSION "\(.*\)"/\1/p' "$ROOT/include/kvroute.h")
  if grep -oE '(libkvroute\.so\.|for version )[0-9]+\.[0-9]+\.[0-9]+' "$README" \
    | sed -E 's/^(libkvroute\.so\.|for version )//' | grep -vxF "$version"; then
    echo "ffi/README.md: the version above is not the header's, $version" >&2
    fail=1
  fi
  for p in "${SHOWN[@]}"; do
    if ! grep -qx "[0-9]* [^ ]* file:$p" "$d/index"; then
      echo "ffi/README.md: no block marked <!-- file: $p -->" >&2
      fail=1
    fi
  done
  if [ "$fail" = 0 ]; then
    echo "ffi/README.md: $(grep -c ' file:' "$d/index") blocks equal their files; its $(grep -c ' sh run:' "$d/index") sh blocks are run by make test-c / test-go"
  fi
  rm -rf "$d"
  return "$fail"
}

# session HOME NAME...: the sh blocks marked run:NAME (for each NAME, in README order, so the
# install comes first), $HOME replaced by HOME, as one script, run from the repository's root.
session() {
  local home=$1 d n lang m
  shift
  d=$(mktemp -d)
  blocks "$d"
  : > "$home/readme-session.sh"
  while read -r n lang m; do
    for name in "$@"; do
      if [ "$m" = "run:$name" ]; then
        sed "s|[$]HOME|$home|g" "$d/$n" >> "$home/readme-session.sh"
      fi
    done
  done < "$d/index"
  rm -rf "$d"
  echo "--- running the README's commands ($*), \$HOME = $home:" >&2
  cat "$home/readme-session.sh" >&2
  echo "---" >&2
  (cd "$ROOT" && env -u PKG_CONFIG_PATH -u LD_LIBRARY_PATH -u CGO_CFLAGS -u CGO_CPPFLAGS -u CGO_LDFLAGS \
    -u CPATH -u C_INCLUDE_PATH -u LIBRARY_PATH -u MAKEFLAGS -u MFLAGS -u MAKELEVEL \
    FFI_PROFILE=debug bash -e -x "$home/readme-session.sh")
}

# expect WHAT COMMAND...: COMMAND prints the README's expected output.
expect() {
  local what=$1
  shift
  if ! "$@" | diff -u --label tests/c/readme_example.out --label "$what" "$EXPECTED" -; then
    echo "ffi/README.md: $what does not print tests/c/readme_example.out" >&2
    return 1
  fi
  echo "$what prints tests/c/readme_example.out"
}

# fragments LANG DIR: the unmarked LANG blocks, as DIR/fragment-N.
fragments() {
  local d n lang m
  d=$(mktemp -d)
  blocks "$d"
  while read -r n lang m; do
    if [ "$lang" = "$1" ] && [ "$m" = - ]; then
      cp "$d/$n" "$2/fragment-$n"
    fi
  done < "$d/index"
  rm -rf "$d"
}

cleanup() {
  if [ "$1" = 0 ]; then
    rm -rf "$HOME_DIR"
  else
    echo "readme.sh: failed; kept $HOME_DIR" >&2
  fi
}

# tmphome NAME: a new temporary directory for $HOME, as HOME_DIR, removed at exit on success.
tmphome() {
  HOME_DIR=$(mktemp -d "${TMPDIR:-/tmp}/kvroute-readme-$1.XXXXXX")
  trap 'cleanup $?' EXIT
}

run_c() {
  tmphome c
  local home=$HOME_DIR prefix=$HOME_DIR/opt/kvroute dir=$HOME_DIR/kvroute-example
  session "$home" install c
  expect "example (rpath)" "$dir/example"
  readelf -d "$dir/example" | grep -q "R.*PATH.*\[$prefix/lib\]"
  expect "example-no-rpath (LD_LIBRARY_PATH)" env LD_LIBRARY_PATH="$prefix/lib" "$dir/example-no-rpath"
  expect "example-static" "$dir/example-static"
  if readelf -d "$dir/example-static" | grep -q libkvroute; then
    echo "example-static loads libkvroute" >&2
    return 1
  fi

  local frag cflags count=0
  mkdir "$home/fragments"
  fragments c "$home/fragments"
  cflags=$(PKG_CONFIG_PATH=$prefix/lib/pkgconfig pkg-config --cflags kvroute)
  for frag in "$home"/fragments/fragment-*; do
    # Right after handle() printed its decision: r, body, routed_ms, d, st and now_ms() exist.
    awk -v frag="$frag" '{ print } /^  printf\("200 %s %s\\n", addr, why\);$/ { print "#include \"" frag "\""; done = 1 }
      END { if (!done) exit 1 }' "$ROOT/tests/c/readme_example.c" > "$frag.c" \
      || { echo "tests/c/readme_example.c: handle()'s printf line not found" >&2; return 1; }
    # shellcheck disable=SC2086
    cc -std=c11 -Wall -Wextra -Werror $cflags -c "$frag.c" -o "$frag.o"
    count=$((count + 1))
  done
  [ "$count" -gt 0 ] || { echo "no C fragment found" >&2; return 1; }
  echo "ffi/README.md: $count C fragments compile inside handle()"
}

run_go() {
  tmphome go
  local home=$HOME_DIR prefix=$HOME_DIR/opt/kvroute mod=$HOME_DIR/myproxy
  session "$home" install go
  expect "myproxy (rpath)" "$mod/myproxy"
  expect "myproxy-no-rpath (LD_LIBRARY_PATH)" env LD_LIBRARY_PATH="$prefix/lib" "$mod/myproxy-no-rpath"

  local d n lang m shown=""
  d=$(mktemp -d)
  blocks "$d"
  while read -r n lang m; do
    [ "$m" = shows:go.mod ] && shown=$d/$n
  done < "$d/index"
  [ -n "$shown" ] || { echo "ffi/README.md: no block marked <!-- shows: go.mod -->" >&2; return 1; }
  if ! sed "s|/path/to/kvroute|$ROOT|" "$shown" | diff -u --label "ffi/README.md's go.mod" --label "$mod/go.mod" - "$mod/go.mod"; then
    echo "ffi/README.md: the go.mod shown is not the one the commands wrote" >&2
    return 1
  fi
  rm -rf "$d"
  echo "go.mod is the one ffi/README.md shows"

  # The package needs nothing else of the checkout: the module again, replacing the package by
  # a copy of ffi/go outside the repository.
  cp -r "$ROOT/ffi/go" "$home/kvroute-go"
  cp -r "$mod" "$home/copy"
  (cd "$home/copy" && go mod edit -replace=example.invalid/kvroute/ffi/go="$home/kvroute-go" \
    && PKG_CONFIG_PATH=$prefix/lib/pkgconfig CGO_LDFLAGS="-Wl,-rpath,$prefix/lib" go build -o myproxy .)
  expect "myproxy built from a copy of ffi/go" "$home/copy/myproxy"

  # Each fragment as a function of main.go's package, in a copy of that module.
  local frag count=0
  mkdir "$home/fragments"
  fragments go "$home/fragments"
  for frag in "$home"/fragments/fragment-*; do
    rm -rf "$home/check" && cp -r "$home/copy" "$home/check"
    {
      printf 'package main\n\nimport (\n\t"fmt"\n\t"log"\n\n\tkvroute "example.invalid/kvroute/ffi/go"\n)\n\n'
      printf 'var _, _, _ = fmt.Sprint, log.Print, kvroute.Version\n\n'
      printf 'func readmeFragment(body []byte) {\n'
      sed 's/^./\t&/' "$frag"
      printf '}\n'
    } > "$home/check/fragment.go"
    (cd "$home/check" && PKG_CONFIG_PATH=$prefix/lib/pkgconfig go vet . && test -z "$(gofmt -l .)")
    count=$((count + 1))
  done
  [ "$count" -gt 0 ] || { echo "no Go fragment found" >&2; return 1; }
  echo "ffi/README.md: $count Go fragments compile in main.go's package"
}

case ${1:-} in
  check) check ;;
  c) run_c ;;
  go) run_go ;;
  *)
    echo "usage: $0 check|c|go" >&2
    exit 2
    ;;
esac
