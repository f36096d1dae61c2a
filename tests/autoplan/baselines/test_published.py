"""`autoplan baseline --recipe published`: published layouts with their source; credible recipes per family."""
import json

from autoplan.baselines import credible


def test_published_gpt3_layout_is_megascales_with_its_source(cli):
    out = cli("baseline", "gpt3-175b", "--cluster", "h100x1024", "--recipe", "published", "--global-batch", "1536",
              "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    plan = d["plan"]
    assert (plan["tp"], plan["pp"], plan["vpp"], plan["dp"], plan["schedule"]) == (8, 8, 6, 16, "interleaved")
    assert "MegaScale" in d["source"] and d["credible"] is True
    assert d["estimate"]["step_time_s"] > 0 and d["estimate"]["fits"]


def test_published_llama3_layout_has_the_reports_one_layer_chunks(cli):
    out = cli("baseline", "llama3-405b", "--cluster", "h100x8192", "--recipe", "published", "--global-batch", "2048",
              "--seq", "8192", "--json")
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    plan = d["plan"]
    assert (plan["tp"], plan["pp"], plan["vpp"], plan["dp"], plan["zero"]) == (8, 16, 8, 64, 2)
    assert plan["layers"] == [0] + [1] * 126 + [0] and "Llama 3" in d["source"]


def test_models_without_a_published_layout_get_one_clear_message(cli):
    out = cli("baseline", "gpt:layers=4,hidden=512,heads=8,vocab=1000", "--cluster", "h100x16", "--recipe",
              "published")
    assert out.returncode == 2 and "no published training layout" in out.stderr and "fix:" in out.stderr
    assert "Traceback" not in out.stderr


def test_recipes_count_only_on_the_family_they_were_written_for(traced):
    moe = traced("moe:layers=2,hidden=256,heads=4,vocab=512,experts=4,topk=2,moe_ffn=512", seq=256)
    dense = traced("gpt:layers=2,hidden=256,heads=4,vocab=512", seq=256)
    assert not credible("llama3", moe) and not credible("fsdp", moe) and credible("deepseek", moe)
    assert credible("llama3", dense) and not credible("deepseek", dense)
    assert credible("megatron", moe) and not credible("published", dense)
