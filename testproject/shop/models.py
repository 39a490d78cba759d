"""A small shop: the domain the testproject's workflows act on."""

from __future__ import annotations

from django.db import models


class Customer(models.Model):
    user_id = models.CharField(max_length=64, unique=True)
    email = models.EmailField()
    engaged = models.BooleanField(default=False)
    version = models.PositiveIntegerField(default=1)

    def __str__(self) -> str:
        return self.user_id


class Order(models.Model):
    customer = models.ForeignKey(Customer, on_delete=models.CASCADE, related_name="orders")
    total_cents = models.PositiveIntegerField()
    status = models.CharField(max_length=20, default="placed")
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"order {self.pk}"


class Tally(models.Model):
    """Counts how often a side effect ran: the durability tests expect 1 each."""

    key = models.CharField(max_length=100, unique=True)
    count = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"{self.key}={self.count}"
