#!/usr/bin/env python3
"""Merges the rounds of bench/gpt_vs_torch.sh into PREFIX.json and PREFIX.md: per row, the
median over the rounds of belay's and PyTorch's medians and the median of the per-round
ratios belay / PyTorch (below 1: belay is faster); the step's parts (bench/gpt.cpp) as the
median over the rounds of each part's ms per step. Plain Python (no torch)."""
import argparse
import json
import statistics


def load(paths, key):
    docs = [json.load(open(p)) for p in paths]
    return [d["torch"]["gpt"] if key == "torch" else d for d in docs]


def med(xs):
    return statistics.median(xs)


def rows_of(belay_rounds, torch_rounds, section, key_fields):
    """One merged row per belay row, with its PyTorch peers (explicit and sdpa attention)."""
    out = []
    for i, row in enumerate(belay_rounds[0]["gpt"][section]):
        key = tuple(row[k] for k in key_fields)
        b_ms = [r["gpt"][section][i]["time"]["median_ms"] for r in belay_rounds]
        merged = {**{k: row[k] for k in key_fields}, "belay_ms": med(b_ms), "belay_ms_rounds": b_ms,
                  "belay_iqr_rel": med(r["gpt"][section][i]["time"]["iqr_rel"] for r in belay_rounds),
                  "belay_tokens_per_s": med(r["gpt"][section][i]["tokens_per_s"] for r in belay_rounds)}
        for attn in ("explicit", "sdpa"):
            peers = [[p for p in t[section] if tuple(p[k] for k in key_fields) == key and p["attn"] == attn]
                     for t in torch_rounds]
            if not all(peers):
                continue
            t_ms = [p[0]["time"]["median_ms"] for p in peers]
            merged[f"torch_{attn}_ms"] = med(t_ms)
            merged[f"torch_{attn}_ms_rounds"] = t_ms
            merged[f"torch_{attn}_tokens_per_s"] = med(p[0]["tokens_per_s"] for p in peers)
            merged[f"ratio_vs_{attn}"] = med(b / t for b, t in zip(b_ms, t_ms))
        out.append(merged)
    return out


def step_label(row):
    """A step-parts column: the batch, and the model unless it is the default one."""
    model = row.get("model", "default")
    return f"batch {row['batch']}" if model == "default" else f"{model} batch {row['batch']}"


def parts_of(belay_rounds, section, label):
    out = []
    for i, row in enumerate(belay_rounds[0]["gpt"][section]):
        rounds = [r["gpt"][section][i] for r in belay_rounds]
        step = med(r["step_ms"] for r in rounds)
        parts = [{"part": p["part"], "ms_per_step": med(r["parts"][j]["ms_per_step"] for r in rounds),
                  "fraction": med(r["parts"][j]["fraction"] for r in rounds),
                  "calls_per_step": p["calls_per_step"]} for j, p in enumerate(row["parts"])]
        out.append({"label": label(row), "dtype": row["dtype"], "step_ms": step, "parts": parts})
    return out


def parts_table(title, rows):
    heads = [f"{p['label']} {p['dtype']}" for p in rows]
    lines = ["", title, "", "| part | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
    for j, p in enumerate(rows[0]["parts"]):
        cells = [f"{s['parts'][j]['ms_per_step']:.2f} ({100 * s['parts'][j]['fraction']:.0f}%)" for s in rows]
        lines.append(f"| {p['part']} | " + " | ".join(cells) + " |")
    lines.append("| **the whole, timed with the parts** | " + " | ".join(f"{s['step_ms']:.2f}" for s in rows) + " |")
    return lines


def markdown(doc):
    f = lambda x: f"{x:.2f}" if x < 100 else f"{x:.0f}"  # noqa: E731
    lines = [f"Machine: {doc['machine']}; belay's CPU path: {doc['cpu_isa']}; PyTorch {doc['torch_version']} "
             f"({doc['torch_cpu_capability']}); {doc['threads']} thread(s), clock {doc['clock']}; "
             f"{doc['rounds']} rounds; load at start: {doc['load_start']}; at end: {doc['load_end']}.", "",
             "Ratio = belay / PyTorch time (median of the per-round ratios; below 1 belay is faster). "
             "`explicit`: PyTorch runs the ops belay runs (q k^T, masked softmax, @ v); `sdpa`: its fused "
             "scaled_dot_product_attention.", "",
             "| block fwd+bwd | dtype | belay ms | torch ms (explicit) | ratio | torch ms (sdpa) | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in doc["block"]:
        lines.append(f"| {r['shape']} B{r['batch']} T{r['tokens']} D{r['width']} H{r['heads']} | {r['dtype']} | "
                     f"{f(r['belay_ms'])} | {f(r['torch_explicit_ms'])} | {r['ratio_vs_explicit']:.2f} | "
                     f"{f(r['torch_sdpa_ms'])} | {r['ratio_vs_sdpa']:.2f} |")
    lines += ["", "| GPT step (default model unless named) | dtype | belay ms | belay tokens/s | torch ms (explicit) | "
              "torch tokens/s | ratio | torch ms (sdpa) | ratio |", "|---|---|---|---|---|---|---|---|---|"]
    for r in doc["step"]:
        model = "" if r["model"] == "default" else f"{r['model']}, "
        explicit = (f"{f(r['torch_explicit_ms'])} | {r['torch_explicit_tokens_per_s']:.0f} | "
                    f"{r['ratio_vs_explicit']:.2f}") if "torch_explicit_ms" in r else "- | - | -"
        lines.append(f"| {model}batch {r['batch']} x {r['context']} | {r['dtype']} | {f(r['belay_ms'])} | "
                     f"{r['belay_tokens_per_s']:.0f} | {explicit} | {f(r['torch_sdpa_ms'])} | {r['ratio_vs_sdpa']:.2f} |")
    note = ("(ms per run, median over the rounds of each part's mean; in brackets its fraction of the run; every "
            "backend call timed, bench/timed_backend.h; `rest` = the run minus the parts: autograd graph, "
            "allocation, host work. The runs with the timer are separate from the timed rows above and, on a "
            "loaded machine, slower: read the fractions.)")
    lines += parts_table("Where belay's block forward + backward goes " + note, doc["block_parts"])
    lines += parts_table("Where belay's GPT step goes " + note, doc["step_parts"])
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--machine", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--load-start", default="")
    ap.add_argument("--load-end", default="")
    ap.add_argument("--out", required=True, help="PREFIX: writes PREFIX.json and PREFIX.md")
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    belay = load(sorted(p for p in a.files if "/belay-" in p), "belay")
    torch_ = load(sorted(p for p in a.files if "/torch-" in p), "torch")
    doc = {"machine": a.machine, "command": a.command, "cpu_isa": belay[0]["cpu_isa"],
           "threads": belay[0]["omp_max_threads"], "clock": belay[0]["clock"], "rounds": len(belay),
           "torch_version": torch_[0]["version"], "torch_cpu_capability": torch_[0]["cpu_capability"],
           "torch_optimizer": torch_[0]["step"][0]["optimizer"],
           "load_start": a.load_start.strip(), "load_end": a.load_end.strip(),
           "block": rows_of(belay, torch_, "block", ("shape", "batch", "tokens", "width", "heads", "dtype")),
           "step": rows_of(belay, torch_, "step", ("model", "batch", "context", "dtype")),
           "block_parts": parts_of(belay, "block_parts", lambda r: r["shape"]),
           "step_parts": parts_of(belay, "step_parts", step_label), "belay_rounds": belay, "torch_rounds": torch_}
    with open(a.out + ".json", "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")
    md = markdown(doc)
    with open(a.out + ".md", "w") as f:
        f.write(md)
    print(md)


if __name__ == "__main__":
    main()
