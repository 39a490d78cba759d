from django.contrib import admin

from testproject.shop.models import Customer, Order

admin.site.register(Customer)
admin.site.register(Order)
