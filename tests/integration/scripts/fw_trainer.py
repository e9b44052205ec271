"""A transformers Trainer user script on tiny random data (no download: a 1-layer BERT built from
a config, no pretrained weights). Its options are TrainingArguments parsed by HfArgumentParser,
which reads a boolean as a value ('--dataloader_pin_memory false'). Writes what TrainingArguments
made of the world to <output_dir>/trainer-<process index>.json."""
import json
import os

import torch
from transformers import BertConfig, BertForSequenceClassification, HfArgumentParser, Trainer, TrainingArguments


class Random(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 32

    def __getitem__(self, i: int) -> dict:
        g = torch.Generator().manual_seed(i)
        return {"input_ids": torch.randint(0, 64, (8,), generator=g), "labels": torch.tensor(i % 2)}


(args,) = HfArgumentParser(TrainingArguments).parse_args_into_dataclasses()
config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32,
                    max_position_embeddings=16, num_labels=2)
torch.manual_seed(0)
result = Trainer(model=BertForSequenceClassification(config), args=args, train_dataset=Random()).train()
state = {"world_size": args.world_size, "process_index": args.process_index, "parallel_mode": str(args.parallel_mode),
         "device": str(args.device), "pin_memory": args.dataloader_pin_memory, "steps": result.global_step,
         "loss": result.training_loss}
print("trainer", json.dumps(state), flush=True)
with open(os.path.join(args.output_dir, f"trainer-{args.process_index}.json"), "x") as f:
    json.dump(state, f)
