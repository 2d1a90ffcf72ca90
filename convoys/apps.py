from django.apps import AppConfig


class ConvoysConfig(AppConfig):
    name = "convoys"
    verbose_name = "Convoys"
    default_auto_field = "django.db.models.BigAutoField"
