"""The endpoints: what each reads from its body, sends upstream and answers."""
