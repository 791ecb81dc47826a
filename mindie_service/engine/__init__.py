"""The engine: one model's continuous batching over a paged KV cache, behind a torch-free contract.

Top level (the door and the wiring):
    contract.py       EngineRequest, TokenEvent, EngineStats, InputFacts: torch-free, what the serving core sees
    client.py         EngineClient, the protocol every engine (and fleet.instances' router) answers
    async_engine.py   AsyncEngine: the engine thread, its inbox, events back to the IO loop
    core.py           LLMEngine: builds the rooms and runs a step (schedule -> run -> sample -> outputs -> update)
    step.py           the step's contract: what the scheduler hands the runner (SchedulerOutput) and back
    sequence.py       Sequence and SequenceGroup, the one object the rooms share

Rooms (each talks to the others through small typed values; the core hands them what they use):
    configs/   EngineConfig and the feature configs (speculative, KV events), apart from their features
    sched/     scheduler, admission rules, batch-line bounds, chunk building, multi-step bursts, its stats
    kv/        block manager (prefix cache), swap to the host pool, KV events and their wire
    sessions/  kept /api/* sessions, their file, spill to disk and the writer off the engine thread
    spec/      speculative decoding: the speculator, n-gram and draft-model proposers, the per-row policy
    sample/    sampler, rejection sampling (spec_accept), beam search, grammar masks
    runner/    model runner, loading the parts (device, weights, tokenizer, pool size), tensor parallel
    output/    detokenizer, output processing and the one stop rule

Arrows point from the core down into the rooms and from rooms to configs/, step, sequence and contract;
.importlinter holds them (no circle between any two modules; no room imports the core; nothing here
imports fleet/, where engines are composed)."""
