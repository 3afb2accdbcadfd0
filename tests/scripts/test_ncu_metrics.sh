#!/usr/bin/env bash
# scripts/ncu_metrics.py on a small CSV shaped like `ncu --csv --page raw --metrics ...` output
# (a line of other output, the header, the units row, two launches of one kernel and one of
# another, plus the columns ncu adds on its own): with the metric list it prints exactly those
# metrics, in that order, as means per kernel, and names a metric the CSV lacks; without it every
# "__" column. Label cpu.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cat >"$work/raw.csv" <<'CSV'
==PROF== Connected to process 1
"ID","Kernel Name","device__attribute_warp_size","dram__bytes_read.sum","gpu__time_duration.sum","launch__grid_size"
"","","","byte","ns",""
"0","void ns::moe_down_t1_slot_kernel<3, 4, 2>(Params)","32","1,000","10","512"
"1","void ns::moe_down_t1_slot_kernel<3, 4, 2>(Params)","32","3,000","30","512"
"2","void ns::moe_gate_up_t1_kernel<2, 6>(Params)","32","5,000","50","768"
CSV
out=$(cd "$root/scripts" && python3 ncu_metrics.py "$work/raw.csv" t \
  gpu__time_duration.sum,dram__bytes_read.sum,not__a_metric.sum)
echo "$out"
grep -q "not in the CSV: not__a_metric.sum" <<<"$out"
grep -q "means per kernel over 3 launches" <<<"$out"
grep -qx "  gpu__time_duration.sum (ns) | dram__bytes_read.sum (byte)" <<<"$out"
grep -qx "  moe_down_t1_slot_kernel<> x2: 20 | 2000" <<<"$out"
grep -qx "  moe_gate_up_t1_kernel<> x1: 50 | 5000" <<<"$out"
! grep -q "launch__grid_size\|device__attribute" <<<"$out"
# Without the list: every column with "__" in its name, the added ones too.
all=$(cd "$root/scripts" && python3 ncu_metrics.py "$work/raw.csv" t)
grep -q "launch__grid_size" <<<"$all"
echo "test_ncu_metrics: PASS"
