import json, sys
d = json.load(open(sys.argv[1]))
for c in d['cells']:
    r = c['run']
    print(f"{c['proposer']:6} {c['workload']:5} c{c['concurrency']:<3} {c['policy']:18} {r['output_tok_s']:7.1f} runs={[round(x) for x in r.get('output_tok_s_runs', [])]} K={r['spec_k_histogram']} acc={r['acceptance_rate']} draft_s={r['draft_time_s']:.2f}")
