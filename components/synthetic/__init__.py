"""Synthetic text from a certified model (issue 25): post-processing of a DP release, certified and sealed.

    prompts.load_prompts(path) -> Prompts          public control codes (validated; one line on bad input)
    generate.generate_records(model, tok, Sampling(records, seed, …), prompts) -> [records]
    corpus.write_records / build_certificate / seal_corpus / verify_corpus_dir

Reads no data: nothing here imports the catalog, a snapshot or a plan annex. Registering a corpus in
MLflow and loading it verified is `components.registry.synthetic` (`load_synthetic`); the CLI and the
secret scan (which needs the catalog's detectors) are `flows/synthetic.py`. docs/synthetic.md.
"""
from components.synthetic.generate import Sampling, generate_records
from components.synthetic.prompts import Prompts, load_prompts, parse_prompts

__all__ = ["Prompts", "Sampling", "generate_records", "load_prompts", "parse_prompts"]
