"""Benchmarks and graders: greedy evaluation of a model on code and math benchmarks.

Modules (one purpose each; no Ray import, so a Ray actor can hold an `Evaluator`):
    eval_records typed records: EvalItem, ItemOutcome, EvalResult, and the metrics.jsonl
                 schema of eval and cost lines the training side writes and `report` reads
    benchmarks   the benchmark registry (name -> data files, loader, prompt, grader, domain)
    loaders      readers for the data files (CRUXEval, HumanEval, LiveCodeBench, MATH-style)
    eval_prompts CRUXEval's prompts, a boxed-answer math prompt, HumanEval; chat templates
    extract      answers out of model text (CRUXEval assertions, code blocks)
    code_grading cruxeval-i/-o, humaneval, livecodebench-exec graded by execution in the sandbox
    math_grading math-verify in worker processes with a host-side timeout (thread safe)
    math_worker  the worker process side of math_grading
    grader       Grader: one entry point for every benchmark; grading a predictions file
    evaluator    Evaluator(model, tokenizer, benchmarks, data_dir, ...).evaluate()
    model_spec   `--model` resolution (local dir, run checkpoint, hub id, smollm2, tiny)
    commands     `compassplay eval ...` argument wiring
    report/      `compassplay report RUN_DIR ...` (build: tables and files; data: runs; plots)
    reference_build        `compassplay reference build ...`
"""
