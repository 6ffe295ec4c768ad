"""Side-by-side comparison of InferFlux with llama-server and llama-cpp-python's server.

Run with `.venv/bin/python bench/compare_servers.py` (or `make bench`); see bench/README.md.

    toolchain   builds llama-server from the pinned llama-cpp-python sdist, and a venv with
                llama-cpp-python[server]; both cached under .cache/compare/
    servers     how each server is started, and its process tree's RSS sampled while it runs
    workloads   the streaming chat/completion load (bench/serve_load.py) and the agent trace
    report      one markdown table per model, ratios, JSON
    runner      the command line: which servers, models, levels
"""
