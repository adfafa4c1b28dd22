# kettle's front door. `make run` and `make test` install what they need
# (Debian packages, via scripts/install-deps.sh), build, and run.
BUILD ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
MODEL ?= models/kettle-demo
CHAT ?= What does kettle mean?

.PHONY: all deps configure build test fuzz run ask bench clean format

all: build

deps:
	bash scripts/install-deps.sh

configure: deps
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE)

build: configure
	cmake --build $(BUILD) -j $(JOBS)

# Every test: unit, golden parity with transformers, the CLI on real files (ctest),
# then the end-to-end tests against reference implementations (Node's test runner,
# test-only npm packages pinned in tests/package-lock.json), then the chat page in
# Debian's headless Chromium (tests/browser/), then a fuzz pass over the request parsers.
test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)
	cd tests && npm ci --no-audit --no-fund --loglevel=error
	cd tests && KETTLE_BIN=$(abspath $(BUILD))/kettle KETTLE_EVALS_DB=$(abspath $(BUILD))/test-evals.sqlite node --test e2e/
	cd tests && KETTLE_BIN=$(abspath $(BUILD))/kettle node --test browser/
	bash tests/fuzz/run.sh $(FUZZ_SECONDS) $(BUILD)

# The request-parser fuzz pass alone (libFuzzer + ASan/UBSan, Debian's clang); longer: make fuzz FUZZ_SECONDS=600
FUZZ_SECONDS ?= 60
fuzz: deps
	bash tests/fuzz/run.sh $(FUZZ_SECONDS) $(BUILD)

# The main job: serve the bundled demo model; open the printed URL for the chat page.
run: build
	$(BUILD)/kettle serve $(MODEL)

# One chat message answered on the terminal, no server.
ask: build
	$(BUILD)/kettle generate --model $(MODEL) --chat "$(CHAT)" --max-tokens 96

bench: build
	$(BUILD)/kettle bench --synthetic llama-3.2-1b

format:
	clang-format -i $$(git ls-files 'src/*.cpp' 'src/*.h' 'tests/*.cpp' 'tests/*.h' 'bench/*.cpp')

clean:
	rm -rf $(BUILD)
