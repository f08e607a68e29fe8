# The two commands of the README. Each one sets everything up on a fresh machine first.
.PHONY: demo test setup lint bench
RUN ?= runs/demo-$(shell date +%Y%m%d-%H%M%S)
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

demo: ## run Aug-PE on the built-in demo corpus with the offline models
	scripts/setup.sh
	.venv/bin/dpsynth generate examples/demo.yaml --output $(RUN)

# A test whose worker crashed runs once more, and fails if it crashes again (a native crash in a
# library took a worker down once in CI, never here); a failing test is never rerun: the
# --rerun-except pattern matches every error (tests/xdist_scheduler.py).
test: ## run the test suite
	scripts/setup.sh --browser
	.venv/bin/python -m pytest -q --reruns 1 --rerun-except '.*'

setup:
	scripts/setup.sh

lint:
	.venv/bin/ruff check src tests benchmarks
