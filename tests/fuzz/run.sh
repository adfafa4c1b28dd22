#!/usr/bin/env bash
# The fuzz pass over the request parsers (HTTP framing, JSON, the API fields)
# and the model-output parser:
# builds tests/fuzz/request_fuzz.cpp with Debian's clang and libFuzzer, under
# AddressSanitizer and UndefinedBehaviorSanitizer, and runs it for SECONDS
# (default 60) from the seed corpus. Exit non-zero on any finding.
#   tests/fuzz/run.sh [SECONDS] [BUILD_DIR]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
seconds=${1:-60}
out=${2:-$root/build}/fuzz
mkdir -p "$out/corpus"
sources=(src/server/request_fields.cpp src/server/json_reader.cpp src/server/openai_protocol.cpp
         src/server/anthropic_protocol.cpp src/server/request_schema.cpp src/server/responses_protocol.cpp
         src/server/response_store.cpp src/server/http/request_parser.cpp src/server/http/message.cpp
         src/server/embeddings_protocol.cpp
         src/server/output_constraint.cpp src/grammar/gbnf_text.cpp src/grammar/json_schema_gbnf.cpp
         src/grammar/regex_gbnf.cpp src/grammar/gbnf_parser.cpp src/grammar/grammar_builder.cpp
         src/tokenizer/unicode.cpp src/chat/output_parser.cpp tests/fuzz/request_fuzz.cpp)
binary="$out/request_fuzz"
newest=$(cd "$root" && ls -t "${sources[@]}" src/server/*.h src/server/http/*.h src/grammar/*.h src/chat/output_parser.h | head -1)
if [ ! -x "$binary" ] || [ "$root/$newest" -nt "$binary" ]; then
  (cd "$root" && clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all \
     -Isrc "${sources[@]}" -lfmt -licuuc -o "$binary")
fi
cp -n "$root"/tests/fuzz/corpus/* "$out/corpus/" 2>/dev/null || true
# -rss_limit_mb: a parser must not balloon; -max_len: bodies up to 64 KB.
"$binary" -max_total_time="$seconds" -max_len=65536 -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
  -artifact_prefix="$out/" "$out/corpus" 2>&1 | tail -n 12
