"""Data sources: Liu et al. files, and seeded generators for offline work."""
from .generate import (ADVERSARIAL_KINDS, fictional_qa_records, generate_fictional_qa, generate_kv, kv_records, seeded_uuid,
                       shared_document_questions, write_jsonl)
from .liu import read_examples, stream_examples

__all__ = ["ADVERSARIAL_KINDS", "read_examples", "stream_examples", "generate_kv", "kv_records", "generate_fictional_qa",
           "fictional_qa_records", "seeded_uuid", "shared_document_questions", "write_jsonl"]
