from django.http import HttpResponse


def unread_count(request):
    return {}


def dashboard(request):
    return HttpResponse("convoyweb")
